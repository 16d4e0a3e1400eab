"""gsrun.base.ids: the one check of job ids, user, node and partition names."""

import pytest

from gsrun.base.errors import InputError
from gsrun.base.ids import check_job_id, is_job_id, is_node_name, is_partition, is_user_name

BAD_ANY = ["", "4242\n", "\n4242", " 4242", "4242 ", "42\x0042", "４２", "4²", "٤٢", "-1", "+1", "4242/..",
           "../4242", "1" * 11, "42.0", "0x2a", "4242+1", "4242_", "_4242", "4242_1_2", "4242_1\n"]


@pytest.mark.parametrize("good", ["0", "7", "4242", "0042", "4294967295", "9" * 10])
def test_plain_job_ids_accepted(good):
    assert is_job_id(good) and is_job_id(good, array=True)
    assert check_job_id(good) == good


@pytest.mark.parametrize("good", ["15053872_1491", "1_0", "0042_07"])
def test_array_job_ids_only_where_asked(good):
    assert is_job_id(good, array=True) and check_job_id(good, array=True) == good
    assert not is_job_id(good)
    with pytest.raises(InputError) as ei:
        check_job_id(good, phase="cgroup")
    assert "JobIDRaw" in str(ei.value)     # the hint says which id to use instead


@pytest.mark.parametrize("bad", BAD_ANY)
def test_bad_job_ids_refused(bad):
    assert not is_job_id(bad) and not is_job_id(bad, array=True)
    for array in (False, True):
        with pytest.raises(InputError):
            check_job_id(bad, array=array)


@pytest.mark.parametrize("bad", [None, 4242, b"4242", ["4242"], True])
def test_job_id_must_be_a_str(bad):
    assert not is_job_id(bad, array=True)
    with pytest.raises(InputError):
        check_job_id(bad, array=True)


def test_job_id_message_shape():
    with pytest.raises(InputError) as ei:
        check_job_id("4242\n../x", phase="mps")
    msg = str(ei.value)
    head, _, hint = msg.partition("\nhint: ")
    assert head == "gsrun: mps: bad job id: '4242\\n../x'"      # one line: the value is a repr
    assert "digits" in hint
    with pytest.raises(InputError) as ei:
        check_job_id("x" * 500, phase="env", what="SLURM_JOB_ID")
    assert str(ei.value).startswith("gsrun: env: bad SLURM_JOB_ID: 'xxx") and len(str(ei.value)) < 300


@pytest.mark.parametrize("good", ["alice", "j.doe", "_svc", "Bob", "a" * 32, "host$", "a-b_c.d"])
def test_user_names(good):
    assert is_user_name(good)


@pytest.mark.parametrize("bad", ["", "1alice", "-x", ".x", "a" * 33, "alice\n", "al ice", "a/b", "al\x00",
                                 "\u212aelvin", "\u017fam", "élodie", "a$b", "a$$", None])
def test_bad_user_names(bad):
    assert not is_user_name(bad)


@pytest.mark.parametrize("good", ["gpu01", "gpu-node01", "n1.ib", "A", "9n", "a" * 64, "x_y"])
def test_node_names(good):
    assert is_node_name(good)


@pytest.mark.parametrize("bad", ["", "-n", ".hidden", "_x", "a" * 65, "gpu01\n", "gpu[01-02]", "a/b", "n\x00",
                                 "gpü", "a b", None])
def test_bad_node_names(bad):
    assert not is_node_name(bad)


@pytest.mark.parametrize("good", ["gpu", "h200_long", "a.b-c", "0", "_", "p" * 64])
def test_partitions(good):
    assert is_partition(good)


@pytest.mark.parametrize("bad", ["", "g p u", "gpu\n", "gpu,cpu", "p" * 65, "gpü", "a/b", None])
def test_bad_partitions(bad):
    assert not is_partition(bad)
