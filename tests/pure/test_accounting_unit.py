"""gsrun.report.accounting pure helpers and retry logic; gseff's accounting view."""

from __future__ import annotations

import os

import pytest

from gsrun.report import accounting
from gsrun.base.errors import InputError, SlurmError
from gsrun.wrapper import gseff

SHOW_CONFIG = """Configuration data as of 2026-11-29T09:27:49
AccountingStorageBackupHost = (null)
AccountingStorageHost   = localhost
AccountingStorageType   = accounting_storage/slurmdbd
ClusterName             = gsrun
"""


def test_parse_show_config_and_slurmdbd():
    c = accounting.parse_show_config(SHOW_CONFIG)
    assert c["ClusterName"] == "gsrun"
    assert accounting.uses_slurmdbd(c)
    assert not accounting.uses_slurmdbd({"AccountingStorageType": "accounting_storage/none"})
    assert "Configuration data as of 2026-11-29T09:27:49" not in c


def test_parse_kv_conf_comments_and_case():
    c = accounting.parse_kv_conf("# x\nStoragePass=a=b#c\n StorageUser = slurm \n\nStorageType=accounting_storage/mysql\n")
    assert c == {"storagepass": "a=b", "storageuser": "slurm", "storagetype": "accounting_storage/mysql"}


@pytest.mark.parametrize("blob,ok", [
    ("JS1:H4sIAAAAAAACA+WQ/w==", True), ("JS1:abc", True), ("js1:abc", False), ("JS1:", False),
    ("JS1:ab'c", False), ("JS1:ab c", False), ("JS1:a;DROP", False), (None, False),
])
def test_valid_js1(blob, ok):
    assert accounting.valid_js1(blob) is ok


def test_retry_waits_for_final_record_then_stores(monkeypatch):
    states = iter([None, "RUNNING", "COMPLETED"])
    monkeypatch.setattr(accounting, "job_state", lambda j, t: next(states))
    stored = []
    monkeypatch.setattr(accounting, "store_admin_comment",
                        lambda *a: stored.append(a) or "sacctmgr")
    sleeps = []
    how = accounting.store_admin_comment_retry("7", "JS1:abc", "gsrun", None, 1.0, 100.0,
                                               sleep=sleeps.append)
    assert how == "sacctmgr"
    assert sleeps == [2.0, 4.0, 8.0]
    assert stored == [("7", "JS1:abc", "gsrun", None, 1.0)]


def test_retry_gives_up_with_last_error(monkeypatch):
    def not_there(*a):
        raise SlurmError("accounting", "sacctmgr modify job failed", "Nothing modified")
    monkeypatch.setattr(accounting, "job_state", lambda j, t: "COMPLETED")
    monkeypatch.setattr(accounting, "store_admin_comment", not_there)
    with pytest.raises(SlurmError, match="Nothing modified"):
        accounting.store_admin_comment_retry("7", "JS1:abc", "gsrun", None, 1.0, 5.0, sleep=lambda s: None)


def test_sql_fallback_refuses_readable_dbd_conf(tmp_path):
    (tmp_path / "slurm.conf").write_text("ClusterName=gsrun\n")
    conf = tmp_path / "slurmdbd.conf"
    conf.write_text("StorageType=accounting_storage/mysql\nStoragePass=secret\n")
    os.chmod(conf, 0o644)
    with pytest.raises(SlurmError, match="not root-owned 0600"):
        accounting._sql_set("7", "JS1:abc", "gsrun", str(tmp_path / "slurm.conf"), 1.0)


def test_sql_fallback_without_conf(tmp_path):
    with pytest.raises(SlurmError, match="no database fallback"):
        accounting._sql_set("7", "JS1:abc", "gsrun", str(tmp_path / "slurm.conf"), 1.0)


BLOB = {"gpus": 8, "total_time": 25, "nodes": {
    "gpu02": {"cpus": 4, "total_time": 15.6, "gpu_utilization": {"0": 37.0, "1": 47.0},
              "gpu_used_memory": {"0": 10 << 30, "1": 20 << 30},
              "gpu_total_memory": {"0": 100 << 30, "1": 100 << 30}},
    "gpu01": {"cpus": 4, "gpu_utilization": {"10": 60.0, "2": 80.0},
              "gpu_total_memory": {"10": 100 << 30, "2": 100 << 30}}}}


def test_gpu_from_js1_means_and_order():
    g = gseff.gpu_from_js1(BLOB)
    assert [(r["node"], r["index"]) for r in g["gpus"]] == [("gpu01", "2"), ("gpu01", "10"),
                                                           ("gpu02", "0"), ("gpu02", "1")]
    assert g["util_mean_pct"] == pytest.approx((37 + 47 + 60 + 80) / 4)
    # memory mean over GPUs with a used figure only (reportseff counts missing as 0)
    assert g["mem_mean_pct"] == pytest.approx(15.0)
    assert gseff.gpu_from_js1({"gpus": 0, "nodes": {}}) == {"gpus": [], "util_mean_pct": None,
                                                             "mem_mean_pct": None}


SACCT_OUT = (
    "4|4|COMPLETED|0:0|2026-11-29T09:34:00|2026-11-29T09:34:25|00:00:25|8|billing=8,cpu=8,gres/gpu=8,node=2"
    "|8G|2||00:31.630|00:30.000|00:01.630|||train.py\n"
    "4.0|4.0|COMPLETED|0:0|2026-11-29T09:34:00|2026-11-29T09:34:24|00:00:24|8|cpu=8,gres/gpu=8,mem=0,node=2"
    "||2|8|00:31.605|00:30.000|00:01.605|322568K|cpu=00:00:28,mem=2557488K|train.py\n")


def test_load_accounting_and_render(monkeypatch):
    from gsrun.report.summary import js1_blob  # noqa: F401 - the blob format is the summary's
    import base64, gzip, json
    comment = "JS1:" + base64.b64encode(gzip.compress(json.dumps(BLOB).encode())).decode()
    monkeypatch.setattr(accounting, "sacct_text", lambda j, t=15.0, fmt=None: SACCT_OUT)
    monkeypatch.setattr(accounting, "admin_comment", lambda j, t=15.0: comment)
    rec = gseff.load_accounting("4")
    e = rec["efficiency"]
    assert e["cpu_eff_pct"] == pytest.approx(31.605 / (8 * 25) * 100)  # sum over steps, not the job line
    assert e["mem_peak_bytes"] == 2557488 * 1024 and e["mem_req_bytes"] == 8 << 30
    assert e["alloc_gpus"] == 8 and rec["js1_error"] is None
    text = gseff.render_accounting(rec)
    assert "CPU efficiency: 15.8%" in text and "Memory efficiency: 30.5%" in text
    assert "GPU utilization: 56.0%" in text


def test_load_accounting_lowercased_blob(monkeypatch):
    monkeypatch.setattr(accounting, "sacct_text", lambda j, t=15.0, fmt=None: SACCT_OUT)
    monkeypatch.setattr(accounting, "admin_comment", lambda j, t=15.0: "js1:h4siaaaa")
    rec = gseff.load_accounting("4")
    assert rec["gpu"] is None and "lowercased" in rec["js1_error"]


def test_load_accounting_unknown_job(monkeypatch):
    monkeypatch.setattr(accounting, "sacct_text", lambda j, t=15.0, fmt=None: "")
    with pytest.raises(InputError, match="unknown job: 99"):
        gseff.load_accounting("99")


def test_config_cached_asks_slurmctld_once_per_slurm_conf_and_ttl(tmp_path, monkeypatch):
    """The controller's background step asked slurmctld for its whole configuration
    (scontrol show config) for every job; it needs two keys, which change only with
    slurm.conf: cached next to the spool, keyed on the file, for at most ttl_s."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c1\n")
    calls = []
    answer = {"AccountingStorageType": "accounting_storage/slurmdbd", "ClusterName": "c1", "SlurmctldPort": "6817"}
    monkeypatch.setattr(accounting, "config", lambda timeout_s=15.0: calls.append(timeout_s) or dict(answer))
    clock = [1000.0]
    get = lambda **kw: accounting.config_cached(str(tmp_path), 7.0, slurm_conf=str(conf), now=lambda: clock[0],
                                                **kw)
    want = {"AccountingStorageType": "accounting_storage/slurmdbd", "ClusterName": "c1"}
    assert get() == want and calls == [7.0]
    assert (tmp_path / accounting.CONFIG_CACHE_NAME).stat().st_mode & 0o777 == 0o600
    clock[0] += 599
    assert get() == want and len(calls) == 1                  # from the cache
    clock[0] += 2
    assert get() == want and len(calls) == 2                  # older than the TTL: asked again
    answer["ClusterName"] = "c2"
    st = conf.stat()
    conf.write_text("ClusterName=c2\n")                       # slurm.conf edited: asked again at once,
    os.utime(conf, ns=(st.st_atime_ns, st.st_mtime_ns))        # even with the same size and mtime (cp -p)
    assert get()["ClusterName"] == "c2" and len(calls) == 3
    assert get()["ClusterName"] == "c2" and len(calls) == 3
    # a cache that is not ours or not JSON is never trusted
    cache = tmp_path / accounting.CONFIG_CACHE_NAME
    os.chmod(cache, 0o666)
    assert get()["ClusterName"] == "c2" and len(calls) == 4
    cache.write_text("{not json")
    assert get()["ClusterName"] == "c2" and len(calls) == 5
    cache.unlink()
    os.symlink(tmp_path / "elsewhere.json", cache)              # a link is never followed: replaced
    assert get()["ClusterName"] == "c2" and len(calls) == 6
    assert not cache.is_symlink() and not (tmp_path / "elsewhere.json").exists()
    cache.unlink()
    os.mkfifo(cache, 0o600)                                    # nor a FIFO read (it would block)
    assert get()["ClusterName"] == "c2" and len(calls) == 7
    cache.unlink()
    # an answer without every key is used for this job but not kept
    del answer["AccountingStorageType"]
    assert get() == {"ClusterName": "c2"} and len(calls) == 8 and not cache.exists()
    answer["AccountingStorageType"] = "accounting_storage/slurmdbd"
    # no slurm.conf to key on: asked every time, nothing written
    assert accounting.config_cached(str(tmp_path), slurm_conf=str(tmp_path / "nope.conf")) == \
        {"AccountingStorageType": "accounting_storage/slurmdbd", "ClusterName": "c2"}
    assert len(calls) == 9 and not cache.exists()


@pytest.mark.parametrize("comment, said", [("JS1:Short", "short-job marker (JS1:Short): the job ran under report.js1_short_s (jobstats' default: 60 s)"),
                                            ("JS1:None", "marker JS1:None: no node figures")])
def test_load_accounting_jobstats_markers(monkeypatch, comment, said):
    monkeypatch.setattr(accounting, "sacct_text", lambda j, t=15.0, fmt=None: SACCT_OUT)
    monkeypatch.setattr(accounting, "admin_comment", lambda j, t=15.0: comment)
    rec = gseff.load_accounting("4")
    assert rec["gpu"] is None and rec["js1"] is None and said in rec["js1_error"]
