"""Slurm accounting (slurmdbd): read a job with ``sacct``, store the ``JS1:``
blob in its ``AdminComment`` as jobstats does (``sacctmgr -i modify job``,
retried while the record reaches slurmdbd). Slurm 22.05's sacctmgr
lowercases values: a mangled read-back is rewritten in slurmdbd's MySQL
table with the credentials of the ``slurmdbd.conf`` next to ``slurm.conf``
(as jobstats' ``ingest_jobstats``). Every call: list argv, a timeout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from contextlib import suppress
from pathlib import Path

from gsrun.base.errors import SlurmError
from gsrun.base.fsutil import atomic_write_json, read_own_file
from gsrun.base.ids import check_job_id
from gsrun.facts.sacct import JobEfficiency, SACCT_FORMAT, efficiency_from_sacct
from gsrun.facts.slurm import TERMINAL_STATES, run_slurm, state_word

JS1_RE = re.compile(r"^JS1:[A-Za-z0-9+/]+={0,2}$")
CLUSTER_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` (``Key   = value`` lines) -> ``{Key: value}``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip() and " " not in k.strip():
            out[k.strip()] = v.strip()
    return out


def parse_kv_conf(text: str) -> dict[str, str]:
    """slurm.conf / slurmdbd.conf ``Key=value`` lines -> ``{key_lower: value}``, the last one winning."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        k, sep, v = line.partition("=")
        if sep and k.strip():
            out[k.strip().lower()] = v.strip()
    return out


def valid_js1(blob: str) -> bool:
    """``JS1:`` + base64 only (it goes into argv and, in the fallback, an SQL literal)."""
    return isinstance(blob, str) and len(blob) < 60000 and bool(JS1_RE.match(blob))


def config(timeout_s: float = 15.0) -> dict[str, str]:
    """slurmctld's running configuration (``scontrol show config``).

    Raises:
        SlurmError: scontrol missing, slurmctld unreachable or timed out.
    """
    return parse_show_config(run_slurm(["scontrol", "show", "config"], timeout_s).stdout)


CONFIG_CACHE_NAME = "slurm-config.json"
CONFIG_CACHE_TTL_S = 600.0
CONFIG_CACHE_KEYS = ("AccountingStorageType", "ClusterName")


def config_cached(cache_dir: str, timeout_s: float = 15.0, ttl_s: float = CONFIG_CACHE_TTL_S,
                  slurm_conf: str | None = None, now=time.time) -> dict[str, str]:
    """:data:`CONFIG_CACHE_KEYS` of :func:`config`, cached in ``<cache_dir>/slurm-config.json`` (root
    0600, complete answers only) for ``ttl_s`` and the same ``slurm.conf`` (path, inode, mtime, ctime,
    size: ctime as ``cp -p`` keeps mtime). A cache not ours, too big or unreadable is ignored.

    Raises:
        SlurmError: as :func:`config`, when the cache cannot answer.
    """
    conf = slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        st = os.stat(conf)
        key = [conf, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size]
    except OSError:
        key = None
    path = os.path.join(cache_dir, CONFIG_CACHE_NAME)
    if key is not None:
        got = _read_config_cache(path)
        if got is not None and got.get("key") == key and isinstance(got.get("time"), (int, float)) \
                and 0 <= now() - got["time"] < ttl_s:
            values = got.get("values")
            if isinstance(values, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in values.items()):
                return values
    full = config(timeout_s)
    values = {k: full[k] for k in CONFIG_CACHE_KEYS if k in full}
    if key is not None and len(values) == len(CONFIG_CACHE_KEYS):
        with suppress(OSError):        # no fsync: a lost cache costs one scontrol
            atomic_write_json(path, {"key": key, "time": now(), "values": values}, mode=0o600, durable=False)
    return values


def _read_config_cache(path: str) -> dict | None:
    raw = read_own_file(path, 1 << 16)
    try:
        got = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        return None
    return got if isinstance(got, dict) else None


def uses_slurmdbd(cfg: dict[str, str]) -> bool:
    return cfg.get("AccountingStorageType", "").endswith("slurmdbd")


def sacct_text(job_id: str, timeout_s: float = 15.0, fmt=SACCT_FORMAT) -> str:
    """``sacct -P -n --format=<fmt> -j JOB`` stdout, steps included (MaxRSS lives on steps).

    Raises:
        InputError: a malformed job id.
        SlurmError: sacct missing, failed (no slurmdbd) or timed out.
    """
    check_job_id(job_id, array=True)
    return run_slurm(["sacct", "-P", "-n", "--format=" + ",".join(fmt), "-j", job_id],
                     timeout_s).stdout


def sacct_efficiency(job_id: str, timeout_s: float = 15.0) -> JobEfficiency:
    """seff's CPU / memory efficiency (:func:`gsrun.facts.sacct.efficiency_from_sacct`)."""
    return efficiency_from_sacct(sacct_text(job_id, timeout_s), SACCT_FORMAT, job_id)


def admin_comment(job_id: str, timeout_s: float = 15.0) -> str | None:
    """The job's AdminComment (None: empty or unknown job). Raises SlurmError as :func:`sacct_text`."""
    out = sacct_text(job_id, timeout_s, ("JobID", "AdminComment"))
    for line in out.splitlines():
        jid, _, text = line.partition("|")
        if "." not in jid:
            return text.strip() or None
    return None


def job_state(job_id: str, timeout_s: float = 15.0) -> str | None:
    """State of the job line in sacct (``COMPLETED``...), None if not recorded yet."""
    out = sacct_text(job_id, timeout_s, ("JobID", "State", "End"))
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and "." not in parts[0]:
            state = state_word(parts[1])
            return state if parts[2] not in ("", "Unknown") else "RUNNING"
    return None


# the last guard under the kernel's MAX_ARG_STRLEN (128 KiB: E2BIG); blobs stay under JS1_CAP_MAX
MAX_ARG_BYTES = 64 * 1024


def _sacctmgr_set(job_id: str, blob: str, timeout_s: float) -> tuple[bool, str]:
    argv = ["sacctmgr", "-i", "modify", "job", "where", f"jobid={job_id}", "set", f"AdminComment={blob}"]
    if max(len(a.encode()) for a in argv) > MAX_ARG_BYTES:
        raise SlurmError("accounting", "blob too long for sacctmgr",
                         f"{len(blob)} characters (at most {MAX_ARG_BYTES} bytes per argument)",
                         hint="lower report.js1_max_chars (docs/CONFIG.md)")
    try:
        cp = run_slurm(argv, timeout_s, check=False)
    except OSError as e:      # E2BIG, ENOMEM...: never an uncaught error
        raise SlurmError("accounting", "sacctmgr could not start", str(e)) from None
    text = (cp.stdout + cp.stderr).strip()
    return cp.returncode == 0 and "Modified" in cp.stdout, text


def sql_job_where(job_id: str) -> str:
    """``id_job=N``, or ``id_array_job=A AND id_array_task=T`` for ``A_T``.

    Raises:
        InputError: not a job id.
    """
    check_job_id(job_id, array=True)
    if "_" in job_id:
        a, t = job_id.split("_")
        return f"id_array_job={int(a)} AND id_array_task={int(t)}"
    return f"id_job={int(job_id)}"


def _sql_set(job_id: str, blob: str, cluster: str, slurm_conf: str | None,
             timeout_s: float) -> str:
    """Write the blob into the job's newest ``<cluster>_job_table`` row. -> what was done.

    Raises:
        SlurmError: no private slurmdbd.conf, no MySQL storage or client, a bad name, the update failed.
    """
    p = Path(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf").parent / "slurmdbd.conf"
    try:
        st = p.stat()
        text = p.read_text()
    except OSError as e:
        raise SlurmError("accounting", "no database fallback", f"{p}: {e.strerror}",
                         hint="run on the slurmdbd host as root, or use Slurm >= 23.02") from None
    if st.st_uid != 0 or st.st_mode & 0o077:
        raise SlurmError("accounting", "no database fallback", f"{p} is not root-owned 0600",
                         hint="slurmdbd.conf must be private to root")
    c = parse_kv_conf(text)
    if not c.get("storagetype", "").endswith("mysql"):
        raise SlurmError("accounting", "no database fallback", f"StorageType={c.get('storagetype')}")
    if not CLUSTER_RE.match(cluster):
        raise SlurmError("accounting", "bad cluster name", repr(cluster)[:80])
    db = c.get("storageloc", "slurm_acct_db")
    if not re.match(r"^[A-Za-z0-9_]{1,64}$", db):
        raise SlurmError("accounting", "bad StorageLoc", repr(db)[:80])
    client = shutil.which("mariadb") or shutil.which("mysql")
    if client is None:
        raise SlurmError("accounting", "no database fallback", "no mariadb/mysql client installed")
    if not valid_js1(blob):
        raise SlurmError("accounting", "refused", "only a job id and a JS1 blob are written")
    # values are allow-listed above: digits, [A-Za-z0-9_-], base64 -- safe in the statement
    sql = (f"UPDATE `{cluster.lower()}_job_table` SET admin_comment='{blob}' "
           f"WHERE {sql_job_where(job_id)} ORDER BY time_submit DESC LIMIT 1;")
    with tempfile.NamedTemporaryFile("w", prefix="gsrun-dbd-", suffix=".cnf", delete=True) as f:
        os.chmod(f.name, 0o600)
        f.write("[client]\n" + "".join(f"{k}={v}\n" for k, v in (
            ("user", c.get("storageuser", "slurm")), ("password", c.get("storagepass") or None),
            ("host", c.get("storagehost", "localhost")), ("port", c.get("storageport") or None)) if v is not None))
        f.flush()
        try:
            cp = subprocess.run([client, f"--defaults-file={f.name}", "--protocol=TCP", db, "-e", sql],
                                capture_output=True, text=True, timeout=timeout_s, errors="replace",
                                cwd="/")
        except subprocess.TimeoutExpired:
            raise SlurmError("accounting", "database timed out", f"no answer in {timeout_s:g} s") from None
    if cp.returncode != 0:
        msg = (cp.stderr or cp.stdout).strip().splitlines()
        raise SlurmError("accounting", "database update failed", msg[-1] if msg else f"exit {cp.returncode}")
    return f"written to {db}.{cluster.lower()}_job_table (sacctmgr lowercases AdminComment)"


def store_admin_comment(job_id: str, blob: str, cluster: str, slurm_conf: str | None = None,
                        timeout_s: float = 15.0) -> str:
    """Store ``blob`` as the job's AdminComment once, read back. -> how it was stored.

    Raises:
        SlurmError: the job not in the database yet (retry), sacctmgr failed, or the value came back
            changed and the database fallback is unavailable.
    """
    check_job_id(job_id, array=True)
    if not valid_js1(blob):
        raise SlurmError("accounting", "not a JS1 blob", repr(blob[:40]))
    ok, text = _sacctmgr_set(job_id, blob, timeout_s)
    if not ok:
        raise SlurmError("accounting", "sacctmgr modify job failed", text.splitlines()[-1] if text else "?",
                         hint="the job record may not have reached slurmdbd yet")
    back = admin_comment(job_id, timeout_s)
    if back == blob:
        return "sacctmgr"
    how = _sql_set(job_id, blob, cluster, slurm_conf, timeout_s)
    back = admin_comment(job_id, timeout_s)
    if back != blob:
        raise SlurmError("accounting", "AdminComment did not stick",
                         f"read back {str(back)[:40]!r}", hint="check slurmdbd.log")
    return how


def store_admin_comment_retry(job_id: str, blob: str, cluster: str, slurm_conf: str | None = None,
                              timeout_s: float = 15.0, deadline_s: float = 180.0,
                              first_wait_s: float = 2.0, log=None, sleep=time.sleep) -> str:
    """:func:`store_admin_comment` once the job is final in slurmdbd, retried (2, 4, ... 30 s) until
    ``deadline_s``.

    Raises:
        SlurmError: the last error when the deadline passed.
    """
    t_end = time.monotonic() + deadline_s
    wait = first_wait_s
    last: Exception | None = None
    while True:
        sleep(wait)
        try:
            state = job_state(job_id, timeout_s)
            if state in TERMINAL_STATES:
                return store_admin_comment(job_id, blob, cluster, slurm_conf, timeout_s)
            last = SlurmError("accounting", "job not final in slurmdbd yet", f"state {state}")
        except SlurmError as e:
            last = e
        if log:
            log(f"AdminComment not stored yet: {last}")
        if time.monotonic() + wait >= t_end:
            raise last
        wait = min(wait * 2, 30.0)
