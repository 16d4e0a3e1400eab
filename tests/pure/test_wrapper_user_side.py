"""gsrun at first contact: the user's interpreter, any command, launchers,
site sbatch options, job names, GPU spreads, the --wait backoff, the config
found beside $SLURM_CONF, torchrun workers in gsrun-bind (all pure or on
files under tmp_path)."""

from __future__ import annotations

import os

import pytest

from gsrun.base.errors import InputError
from gsrun.bind.plan import worker_environ
from gsrun.request.config import DEFAULT_CONFIG_PATH, config_path, load_config
from gsrun.wrapper.command import build_command, choose_python, launcher_in, refuse_launcher
from gsrun.wrapper.spec import parse_sbatch_option, plan_nodes, sbatch_word, validate_fields, validate_site
from gsrun.wrapper.submit import poll_interval


def _exe(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


# ------------------------------------------------------------ the interpreter

def test_python_order_flag_env_venv_conda_path(tmp_path):
    onpath = _exe(tmp_path / "bin" / "python3")
    venv = _exe(tmp_path / "venv" / "bin" / "python3")
    conda = _exe(tmp_path / "conda" / "bin" / "python3")
    other = _exe(tmp_path / "other" / "python3.12")
    env = {"PATH": str(tmp_path / "bin"), "VIRTUAL_ENV": str(tmp_path / "venv"),
           "CONDA_PREFIX": str(tmp_path / "conda"), "GSRUN_PYTHON": other}
    assert choose_python(onpath, env).path == onpath and "--python" in choose_python(onpath, env).why
    assert choose_python(None, env).path == other and "GSRUN_PYTHON" in choose_python(None, env).why
    del env["GSRUN_PYTHON"]
    assert choose_python(None, env).path == venv and "VIRTUAL_ENV" in choose_python(None, env).why
    del env["VIRTUAL_ENV"]
    assert choose_python(None, env).path == conda and "CONDA_PREFIX" in choose_python(None, env).why
    del env["CONDA_PREFIX"]
    p = choose_python(None, env)
    assert p.path == onpath and "PATH" in p.why


def test_python_keeps_the_venv_symlink(tmp_path):
    base = _exe(tmp_path / "base" / "python3")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    os.symlink(base, tmp_path / "venv" / "bin" / "python3")
    p = choose_python(None, {"VIRTUAL_ENV": str(tmp_path / "venv"), "PATH": ""})
    assert p.path == str(tmp_path / "venv" / "bin" / "python3")   # not resolved to the base interpreter


def test_python_name_resolved_on_path_and_missing_refused(tmp_path):
    p = _exe(tmp_path / "bin" / "python3.11")
    assert choose_python("python3.11", {"PATH": str(tmp_path / "bin")}).path == p
    with pytest.raises(InputError) as ei:
        choose_python("nope-python", {"PATH": str(tmp_path / "bin")})
    assert "bad --python" in str(ei.value) and "hint:" in str(ei.value)


def test_python_comment_is_one_line(tmp_path):
    d = tmp_path / "a\nb"
    _exe(d / "bin" / "python3")
    p = choose_python(None, {"VIRTUAL_ENV": str(d), "PATH": ""})
    assert "\n" not in p.comment()


# ------------------------------------------------------------ commands and launchers

def test_missing_and_unreadable_script_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    py = choose_python(_exe(tmp_path / "python3"), {})
    with pytest.raises(InputError) as ei:
        build_command("script", ["trian.py"], py)
    assert str(ei.value).startswith("gsrun: submit: no such script: 'trian.py'") and "hint:" in str(ei.value)
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    with pytest.raises(InputError) as ei:
        build_command("script", ["./run.sh"], py)
    assert "not executable" in str(ei.value) and "hint:" in str(ei.value)
    (tmp_path / "train.py").write_text("")
    assert build_command("script", ["train.py", "a b"], py) == (py.path, str(tmp_path / "train.py"), "a b")
    assert build_command("cmd", ["python", "-m", "x"], None) == ("python", "-m", "x")
    assert build_command("module", ["--lr", "1"], py, "pkg.train") == (py.path, "-m", "pkg.train", "--lr", "1")


@pytest.mark.parametrize("argv,found", [
    (["torchrun", "--nproc-per-node=8", "t.py"], "torchrun"),
    (["/usr/bin/torchrun", "t.py"], "torchrun"),
    (["python", "-m", "torch.distributed.run", "t.py"], "torchrun"),
    (["python3.11", "-u", "-m", "torch.distributed.launch", "t.py"], "torchrun"),
    (["accelerate", "launch", "t.py"], "accelerate launch"),
    (["deepspeed", "t.py"], "deepspeed"),
    (["accelerate", "config"], None), (["python", "t.py"], None), (["nvidia-smi"], None),
])
def test_known_launchers(argv, found):
    assert launcher_in(argv) == found


def test_torchrun_as_cmd_refused_with_launcher_hint():
    with pytest.raises(InputError) as ei:
        refuse_launcher(["torchrun", "--nproc-per-node=8", "train.py"])
    msg = str(ei.value)
    assert msg.startswith("gsrun: submit: torchrun would start") and "hint:" in msg and "--launcher torchrun" in msg
    with pytest.raises(InputError):
        refuse_launcher((), "torch.distributed.run")
    refuse_launcher(["python", "train.py"])


# ------------------------------------------------------------ sbatch options and names

def test_sbatch_option_parsed_and_refusals():
    assert parse_sbatch_option("--licenses=fluent:2") == ("licenses", "fluent:2")
    assert parse_sbatch_option("--nice") == ("nice", None)
    for bad, why in [("--job-name=x", "gsrun renders --job-name"), ("--job=x", "gsrun renders --job-name"),
                     ("--x\n#SBATCH --uid=0", "no newline"), ("-A x", "one long option"),
                     ("--gs-mps=50", "gsrun's own"), ("--chdir=/", "cd there"), ("--account=x", "-A/--account"),
                     ("--wait", "gsrun --wait")]:
        with pytest.raises(InputError) as ei:
            parse_sbatch_option(bad)
        assert str(ei.value).startswith("gsrun: submit: bad --sbatch") and why in str(ei.value), bad
        assert "hint:" in str(ei.value)


@pytest.mark.parametrize("key,good,bad", [
    ("account", "proj-123", "a b"), ("qos", "high,normal", "x;y"), ("constraint", "h200&ib|[a*2]", "a b"),
    ("mem", "512G", "1.5G"), ("reservation", "maint", "a\nb"), ("dependency", "afterok:12:13,singleton", "$(id)"),
    ("signal", "B:USR1@120", "USR1 @1"),
])
def test_site_options_allow_lists(key, good, bad):
    validate_site({key: good})
    with pytest.raises(InputError) as ei:
        validate_site({key: bad})
    assert "bad" in str(ei.value) and "hint:" in str(ei.value)


def _sbatch_get_argument(line: str) -> list[str]:
    """sbatch's #SBATCH word splitter as Slurm 22.05 behaves (src/sbatch/opt.c
    _get_argument, checked by submitting on the local cluster): a blank outside
    quotes ends the word even after a backslash; " and ' quote; otherwise a
    backslash takes the next character literally; an unquoted # ends the line."""
    words, cur, started, quoted, q, esc = [], [], False, False, "", False
    for ch in line:
        if not quoted and ch.isspace():
            if started:
                words.append("".join(cur))
                cur, started = [], False
            esc = False
            continue
        if esc:
            cur.append(ch)
            esc = False
            started = True
            continue
        if ch == "\\":
            esc, started = True, True
            continue
        if quoted:
            if ch == q:
                quoted = False
            else:
                cur.append(ch)
            continue
        if ch in "\"'":
            quoted, q, started = True, ch, True
            continue
        if ch == "#":
            break
        cur.append(ch)
        started = True
    if started:
        words.append("".join(cur))
    return words


def test_the_transcription_matches_what_sbatch_22_05_did():
    """Observed on the local cluster: a backslash-blank splits, quotes keep."""
    assert _sbatch_get_argument("--job-name=bert\\ base") == ["--job-name=bert", "base"]
    assert _sbatch_get_argument('--job-name="a \\"q\\" b"') == ['--job-name=a "q" b']
    assert _sbatch_get_argument('--job-name="back\\\\slash"') == ["--job-name=back\\slash"]


@pytest.mark.parametrize("name", ["bert base", "it's \"x\"", "$(id) `id` #1", "a\\b", "tab\tx", "é 😀", "#", "a  b"])
def test_job_name_any_printable_and_sbatch_reads_it_back(name):
    if "\t" in name:
        with pytest.raises(InputError):
            validate_fields(name, None, None, None, None)
        return
    validate_fields(name, None, None, None, None)
    assert _sbatch_get_argument(f" --job-name={sbatch_word(name)}") == [f"--job-name={name}"]


@pytest.mark.parametrize("name", ["a\nb", "x\r", "\x1b[31m", "", "x" * 300, "my hetjob"])
def test_job_name_control_characters_refused(name):
    with pytest.raises(InputError) as ei:
        validate_fields(name, None, None, None, None)
    assert "bad --job-name" in str(ei.value) and "hint:" in str(ei.value)


# ------------------------------------------------------------ placement

def test_gpus_spread_and_refusals():
    assert plan_nodes(6, None, None, 4) == (2, 3)
    assert plan_nodes(8, None, None, 4) == (2, 4)
    assert plan_nodes(3, None, None, 4) == (1, 3)
    assert plan_nodes(12, None, None, 8) == (2, 6)
    with pytest.raises(InputError) as ei:
        plan_nodes(7, None, None, 4)
    msg = str(ei.value)
    assert "--gpus 8" in msg and "--gpus 4" in msg and "--gpus 7 --nodes 7" in msg and "hint:" in msg
    with pytest.raises(InputError) as ei:
        plan_nodes(6, None, 4, None)
    assert "--gpus 6 --nodes 2" in str(ei.value)
    with pytest.raises(InputError) as ei:
        plan_nodes(6, 4, None, None)
    assert "--nodes 1 or 2 or 3 or 6" in str(ei.value)


# ------------------------------------------------------------ --wait, config, workers

def test_poll_backoff():
    assert [poll_interval(t) for t in (0, 5, 14.9)] == [3.0, 3.0, 3.0]
    seq = [poll_interval(t) for t in range(15, 400, 5)]
    assert seq == sorted(seq) and seq[0] > 3.0 and max(seq) == 60.0
    # a job pending for an hour: about one poll a minute once the backoff has grown (not 3600)
    t, rpcs = 0.0, 0
    while t < 3600:
        t += poll_interval(t)
        rpcs += 1
    assert 60 < rpcs < 80


def test_config_beside_slurm_conf(tmp_path):
    (tmp_path / "slurm.conf").write_text("")
    env = {"SLURM_CONF": str(tmp_path / "slurm.conf")}
    assert config_path(None, env) == (DEFAULT_CONFIG_PATH, False)
    (tmp_path / "gsrun.toml").write_text('[paths]\nspool_dir = "/x/spool"\n')
    assert config_path(None, env) == (str(tmp_path / "gsrun.toml"), False)
    assert load_config(environ=env)["paths.spool_dir"] == "/x/spool"
    assert config_path(None, dict(env, GSRUN_CONFIG="/y.toml")) == ("/y.toml", True)
    assert config_path("/z.toml", env) == ("/z.toml", True)
    assert config_path(None, {"SLURM_CONF": "relative/slurm.conf"}) == (DEFAULT_CONFIG_PATH, False)


def test_worker_environ_torchrun():
    slurm = {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_NTASKS_PER_NODE": "1"}
    env, worker = worker_environ(dict(slurm, LOCAL_RANK="3", LOCAL_WORLD_SIZE="4"))
    assert worker and env["SLURM_LOCALID"] == "3" and env["SLURM_NTASKS_PER_NODE"] == "4"
    assert "SLURM_STEP_TASKS_PER_NODE" not in env
    # one task per GPU with the same counts: Slurm describes the task already
    per_gpu = {"SLURM_LOCALID": "2", "SLURM_STEP_TASKS_PER_NODE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}
    assert worker_environ(per_gpu) == (per_gpu, False)
    assert worker_environ({"SLURM_LOCALID": "1"})[1] is False
    assert worker_environ(dict(slurm, LOCAL_RANK="x", LOCAL_WORLD_SIZE="4"))[1] is False
    env, worker = worker_environ(dict(slurm, LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GSRUN_LAUNCHER="torchrun"))
    assert worker and env["SLURM_LOCALID"] == "0"


def test_sbatch_word_escapes_only_what_sbatch_parses():
    assert sbatch_word("plain-name_1.2") == "plain-name_1.2"
    assert sbatch_word("bert base") == '"bert base"'
    assert sbatch_word('a"b\\c') == '"a\\"b\\\\c"'
    hostile = "a b c #d 'e' \"f\" \\g"
    assert _sbatch_get_argument(sbatch_word(hostile) + " # a comment") == [hostile]
