"""Site configuration: ``/etc/gsrun/gsrun.toml`` (:func:`config_path`).

:data:`SETTINGS` names every key's type, default, allowed values and meaning;
the parser, ``config check``, the commented file and docs/CONFIG.md come
from it. Parsed strictly (``tomllib``): an unknown key or a bad value is a
:class:`ConfigError` naming it. ``[partition.<name>]`` overrides
``tuning.*``, ``mps.*``, ``mig.*`` and ``findings.*`` for that partition.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Callable

from gsrun.base.errors import ConfigError
from gsrun.base.ids import is_partition
from gsrun.base.paths import DEFAULT_MPS_DIR, DEFAULT_SPOOL_DIR, DEFAULT_STATE_DIR
from gsrun.request.malloc import (ALLOCATORS, JEMALLOC_CONF, LIB_DIRS as MALLOC_LIB_DIRS, TCMALLOC_ENV, check_conf_list,
                                  check_lib_dirs, check_tcmalloc_env)
from gsrun.request.mig_layout import parse_layout
from gsrun.request.tune import TUNE_KEYS, parse_tune_request
from gsrun.request.waste import IdleConfig, check_idle_value

ENV_CONFIG = "GSRUN_CONFIG"
DEFAULT_CONFIG_PATH = "/etc/gsrun/gsrun.toml"

_PINNED = r"[0-9]+=[0-9]+[MG](,[0-9]+=[0-9]+[MG])*"
_ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]*")
_HOST_NAME_RE = re.compile(r"[A-Za-z0-9.-]{1,253}")
_EMAIL_RE = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+")


def is_env_name(name: str) -> bool:
    """``[A-Z_][A-Z0-9_]*`` (an environment variable name gsrun sets)."""
    return _ENV_NAME_RE.fullmatch(name) is not None


def is_host_name(value: str) -> bool:
    """``[A-Za-z0-9.-]{1,253}``."""
    return _HOST_NAME_RE.fullmatch(value) is not None


def is_email(value: str) -> bool:
    """``local@domain``: local ``[A-Za-z0-9._%+-]+``, domain ``[A-Za-z0-9.-]+`` -- what
    ``[mail] from_addr`` may be. A recipient (a job's MailUser) is checked by
    :mod:`gsrun.report.mail`, which also takes a display name."""
    return _EMAIL_RE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of the config: ``key`` ``"section.name"``; ``type`` a type or
    a tuple of types; ``check`` returns a problem (text) or None; ``allowed``
    human text of the allowed range; ``per_partition`` may be overridden in
    ``[partition.<name>.<section>]``."""

    key: str
    type: type | tuple
    default: Any
    meaning: str
    check: Callable[[Any], str | None] | None = None
    allowed: str = ""
    per_partition: bool = False


def _range(lo, hi):
    def check(v):
        return None if lo <= v <= hi else f"must be between {lo} and {hi}"
    return check


def _abs_path(v):
    return None if v.startswith("/") and "\n" not in v and "\0" not in v else "must be an absolute path"


def _octal_mode(v):
    if not (isinstance(v, str) and 3 <= len(v) <= 4 and all(c in "01234567" for c in v)):
        return "an octal mode like \"0640\""
    if int(v, 8) & 0o7133:
        return "no set-id, sticky, execute or group/other write bit"
    return None


def _opt_abs_path(v):
    return None if v == "" else _abs_path(v)


def _tune_list(v):
    try:
        parse_tune_request(v)
    except Exception as e:  # noqa: BLE001 - turned into the config message
        return str(getattr(e, "detail", e))
    return None


def _key_list(v):
    bad = [k for k in v if k not in TUNE_KEYS]
    return f"unknown tuning keys {bad}; allowed: {', '.join(TUNE_KEYS)}" if bad else None


def _env_table(v):
    for k, val in v.items():
        if not is_env_name(k) or not isinstance(val, str) or "\n" in val or "\0" in val:
            return f"entry {k!r} must be NAME = \"value\" (A-Z, 0-9, _; one line)"
    return None


def _line(v):
    return None if not any(c in v for c in "\n\r\0") else "must be one line"


def _bin(v):
    if v.startswith("/"):
        return _abs_path(v)
    return None if re.fullmatch(r"[A-Za-z0-9_.+-]{1,255}", v) else "must be an absolute path or a plain command name"


def _pinned(v):
    return None if v == "" or re.fullmatch(_PINNED, v) else "must look like 0=16G,1=16G (GPU=SIZE with M or G)"


def _host(v):
    return None if v == "" or is_host_name(v) else "must be a host name"


def _listen_address(v):
    """"", a literal IPv4/IPv6 address or a host name: where an endpoint listens."""
    if v == "" or is_host_name(v):
        return None
    try:
        ipaddress.ip_address(v)
        return None
    except ValueError:
        return "must be empty (every address), an IPv4 or IPv6 address, or a host name"


def _url(v):
    return None if v == "" or re.fullmatch(r"https?://[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]{1,500}", v) \
        else "must be an http:// or https:// URL without spaces or quotes"


def _email(v):
    return None if v == "" or is_email(v) else "must be an email address"


def _layouts(v):
    for name, lay in v.items():
        if not re.match(r"^[A-Za-z0-9_-]{1,64}\Z", name) or not isinstance(lay, str):
            return f"layout name {name!r} must be [A-Za-z0-9_-] with a string value"
        try:
            parse_layout(lay)
        except Exception as e:  # noqa: BLE001
            return f"layout {name!r}: {getattr(e, 'detail', e)}"
    return None


def _idle(key):
    def check(v):
        return check_idle_value(key, v)
    return check


SETTINGS: tuple[Setting, ...] = (
    Setting("paths.state_dir", str, DEFAULT_STATE_DIR,
            "Journals of node changes, sampler state, sockets, locks (tmpfs: gone at reboot, which is right).",
            _abs_path, "absolute path"),
    Setting("paths.spool_dir", str, DEFAULT_SPOOL_DIR,
            "Node summaries, job summaries and the mail queue (persistent).", _abs_path, "absolute path"),
    Setting("paths.mps_dir", str, DEFAULT_MPS_DIR,
            "Parent of per-job MPS pipe/log directories (<mps_dir>/<jobid>/{pipe,log}).",
            _abs_path, "absolute path"),
    Setting("spool.retention_days", int, 180,
            "gsrun-node prune (and doctor's spool check): job directories of the spool older than this many "
            "days whose summary is stored in accounting (AdminComment) are removed; 0 = keep forever.",
            _range(0, 36500), "0-36500"),
    Setting("sampler.interval_s", (int, float), 5.0,
            "Seconds between samples of NVML and the job cgroup.", _range(0.05, 3600), "0.05-3600"),
    Setting("sampler.flush_s", (int, float), 30.0,
            "Seconds between atomic rewrites of the sampler state (a killed sampler loses at most this).",
            _range(0.1, 3600), "0.1-3600"),
    Setting("sampler.timeline_points", int, 1000,
            "Most points kept per metric in the downsampled timeline.", _range(10, 100000), "10-100000"),
    Setting("metrics.textfile_dir", str, "",
            "Directory of node_exporter's textfile collector (--collector.textfile.directory, e.g. "
            "/var/lib/prometheus/node-exporter): the sampler writes each job's GPU metrics to "
            "gsrun_job_<jobid>.prom there at every flush and the epilog removes it; empty = off.",
            _opt_abs_path, "absolute path or empty"),
    Setting("metrics.textfile_mode", str, "0640",
            "Privacy: mode of the .prom files (octal). The default 0640 lets only root and the file's group "
            "(metrics.textfile_group) read a job's user, id and GPU figures; 0644 shows them to every local "
            "user.", _octal_mode, "octal mode, no write or execute bit for group or others (0600, 0640, 0644)"),
    Setting("metrics.textfile_group", str, "",
            "Privacy: group of the .prom files, the group node_exporter reads them with (e.g. prometheus); "
            "empty = the group of metrics.textfile_dir.", None, "group name or empty"),
    Setting("metrics.http_port", int, 9400,
            "TCP port of the node daemon's Prometheus endpoint (/metrics): every GPU of the node, with the "
            "labels of the job holding it (job_id=\"\" for a GPU no job holds); 0 = off. 9400 is also "
            "dcgm-exporter's port: a node running both needs one of them moved.", _range(0, 65535), "0-65535"),
    Setting("metrics.http_address", str, "",
            "Address the Prometheus endpoint listens on: empty = every address (IPv6 and IPv4), or one of "
            "the node's addresses (e.g. 127.0.0.1 or a management network's) or a host name resolving to one.",
            _listen_address, "IP address, host name or empty"),
    Setting("metrics.user_label", bool, True,
            "Privacy: put the job's user name in the user label of every series; false = leave the label out "
            "(the job id still ties a series to a job for those who may read Slurm's records).", None,
            "true/false"),
    Setting("live.flush_s", (int, float), 30.0,
            "Seconds between rewrites of a running job's live node file in the shared spool (what gseff shows "
            "while the job runs; aggregates only, about 1 KiB per GPU); also written once per alert or cancel.",
            _range(30, 3600), "30-3600"),
    Setting("tuning.enabled", bool, True, "Apply node tuning at all.", None, "true/false", True),
    Setting("tuning.exclusive_only", bool, True,
            "Node-wide settings only for jobs that hold the node exclusively.", None, "true/false", True),
    Setting("tuning.defaults", str, "",
            "Tuning applied to every job (same form as --tune: key=value,...).", _tune_list,
            "key=value list", True),
    Setting("tuning.allowed_keys", list, list(TUNE_KEYS),
            "Keys users may request with --tune / --gs-tune.", _key_list, ", ".join(TUNE_KEYS), True),
    Setting("tuning.irqbalance_policy_script", str, "/usr/local/libexec/gsrun-irqbalance-policy",
            "Where gsrun-node install puts gsrun's irqbalance policy script; irq=local is applied while "
            "irqbalance runs only when it was started with -l/--policyscript= this path.", _abs_path,
            "absolute path"),
    Setting("tuning.irqbalance_ban_dir", str, "/run/gsrun/irqbalance-ban",
            "Directory of the IRQ ban files irq=local writes for the policy script (one file per IRQ; the "
            "script's GSRUN_IRQ_BAN_DIR, same default).", _abs_path, "absolute path"),
    Setting("mps.enabled", bool, True, "Allow per-job MPS daemons.", None, "true/false", True),
    Setting("mps.control_bin", str, "nvidia-cuda-mps-control",
            "MPS control daemon executable (name on PATH or absolute path).", _bin, "path or name"),
    Setting("mps.default_active_thread_percentage", int, 0,
            "Default CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for MPS jobs (0 = leave unset).",
            _range(0, 100), "0-100", True),
    Setting("mps.pinned_mem_limit", str, "",
            "Default CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (e.g. \"0=16G\"; empty = unset).",
            _pinned, "N=SIZE[MG],... or empty", True),
    Setting("mps.exclusive_process", bool, False,
            "Set EXCLUSIVE_PROCESS compute mode on the job's GPUs while its MPS daemon runs.",
            None, "true/false", True),
    Setting("mps.quit_timeout_s", (int, float), 10.0,
            "Seconds to wait for the MPS daemon to quit before ending its recorded PIDs.",
            _range(0.1, 300), "0.1-300"),
    Setting("mig.enabled", bool, True, "Allow per-job MIG layouts on exclusive nodes.", None, "true/false", True),
    Setting("mig.layouts", dict, {}, "Site-named MIG layouts, e.g. small = \"7x1g.18gb\".", _layouts,
            "name = layout"),
    Setting("nccl.env", dict, {"NCCL_DEBUG": "WARN"},
            "NCCL environment exported by gsrun's job scripts (site overrides).", _env_table, "NAME = \"value\""),
    Setting("malloc.default", str, "",
            "Allocator preloaded into every gsrun job that does not pass --malloc (jemalloc, tcmalloc; "
            "empty = none). The job script finds the library on the node (malloc.lib_dirs, then ldconfig -p) "
            "and stops before srun, naming the package, when it is absent.",
            lambda v: None if v in ("", *ALLOCATORS) else "must be jemalloc, tcmalloc or empty",
            "jemalloc|tcmalloc|\"\""),
    Setting("malloc.lib_dirs", list, list(MALLOC_LIB_DIRS),
            "Directories the job script searches for the allocator library on the node, in order "
            "(then ldconfig -p).", check_lib_dirs, "absolute paths"),
    Setting("malloc.jemalloc_conf", str, JEMALLOC_CONF,
            "MALLOC_CONF exported with jemalloc (a MALLOC_CONF the job already has wins; empty = unset).",
            check_conf_list, "key:value,... or empty"),
    Setting("malloc.tcmalloc_env", dict, dict(TCMALLOC_ENV),
            "TCMALLOC_* environment exported with tcmalloc (gperftools).", check_tcmalloc_env,
            "TCMALLOC_NAME = \"value\""),
    Setting("malloc.pytorch_cuda_alloc_conf", str, "",
            "PYTORCH_CUDA_ALLOC_CONF exported by every gsrun job script, e.g. \"expandable_segments:True\" "
            "(one the job already has wins; empty = unset).", check_conf_list, "key:value,... or empty"),
    Setting("findings.idle_util_pct", (int, float), 5.0,
            "A GPU with mean utilization below this is reported idle.", _range(0, 100), "0-100", True),
    Setting("findings.low_sm_activity_pct", (int, float), 25.0,
            "SM activity below this (while busy) is reported as low.", _range(0, 100), "0-100", True),
    Setting("findings.mem_overrequest_pct", (int, float), 25.0,
            "Host memory high water below this share of the request is an over-request.",
            _range(0, 100), "0-100", True),
    Setting("findings.cpu_saturated_pct", (int, float), 90.0,
            "CPU efficiency above this while GPUs are under-used suggests a CPU-bound input pipeline.",
            _range(0, 100), "0-100", True),
    Setting("findings.short_job_s", (int, float), 60.0,
            "Jobs shorter than this get no efficiency advice (numbers not meaningful).",
            _range(0, 86400), "0-86400", True),
    Setting("findings.low_util_note_pct", (int, float), 50.0,
            "Mean GPU utilization (busy share) below this is noted (verdict: could be better).",
            _range(0, 100), "0-100", True),
    Setting("findings.low_util_warn_pct", (int, float), 25.0,
            "Mean GPU utilization below this is a warning (verdict: wasteful).", _range(0, 100), "0-100", True),
    Setting("findings.time_limit_used_pct", (int, float), 25.0,
            "A job that used less than this share of its time limit (and 30 min or more below it) is told "
            "to ask for less time.", _range(0, 100), "0-100", True),
    Setting("findings.cpu_good_pct", (int, float), 50.0,
            "CPU efficiency at or above this is good in the verdict (below 10 % is wasteful).",
            _range(0, 100), "0-100", True),
    Setting("findings.mem_good_pct", (int, float), 50.0,
            "Host memory high water at or above this share of the request is good in the verdict (below "
            "findings.mem_overrequest_pct is wasteful).", _range(0, 100), "0-100", True),
    Setting("idle.warn_after_min", (int, float), 60.0,
            "A GPU of a running job idle this many minutes in a row (utilization ~0, SM activity ~0 where GPM "
            "reads it, power near its idle level; or no process of the job on it) is a gpu_idle finding and "
            "alert; gpu_never_used when the job never touched it.", _idle("warn_after_min"), "0.05-100000"),
    Setting("idle.cancel_after_min", (int, float), 0,
            "Cancel (scancel) a job whose allocated GPUs have all been idle this many minutes; 0 = never "
            "(the default). Needs idle.cancel = \"on\" (or \"report\" for a dry run).",
            _idle("cancel_after_min"), "0-100000"),
    Setting("idle.cancel", str, "off",
            "off: never cancel; report: tell the admins what would have been cancelled (dry run); on: cancel.",
            _idle("cancel"), "off|report|on"),
    Setting("idle.cancel_grace_min", (int, float), 15.0,
            "Minutes between the warning and the cancel: when a job reaches its idle limit, gsrun first "
            "warns its user (mail, live report) and cancels only if its GPUs are still all idle this many "
            "minutes later; a GPU that works again in between withdraws the warning.",
            _idle("cancel_grace_min"), "0-100000"),
    Setting("idle.stuck_after_min", (int, float), 15.0,
            "Utilization high while SM and tensor activity stay ~0 at near-idle power for this many minutes "
            "(a hung collective, or kernels too small to matter) is a gpu_stuck_collective finding. Without GPM "
            "(SM activity unknown): see stuck_power_max_pct and stuck_link_max_kbs.", _idle("stuck_after_min"), "0.05-100000"),
    Setting("idle.util_idle_pct", (int, float), 1.0,
            "Utilization at or below this (per poll) counts as idle.", _idle("util_idle_pct"), "0-100"),
    Setting("idle.sm_idle_pct", (int, float), 1.0,
            "SM activity (and tensor activity) at or below this (per poll, GPM) counts as ~0.",
            _idle("sm_idle_pct"), "0-100"),
    Setting("idle.power_idle_margin_w", (int, float), 60.0,
            "Power within this many watts above the GPU's idle level (the lowest reading of the job, first "
            "taken by the prolog) counts as near idle. An H200 holding a CUDA context and running nothing "
            "draws ~45 W above its bare idle.", _idle("power_idle_margin_w"), "0-2000"),
    Setting("idle.util_stuck_pct", (int, float), 90.0,
            "Utilization at or above this (with SM activity ~0 at near-idle power) counts towards a stuck "
            "collective.", _idle("util_stuck_pct"), "0-100"),
    Setting("idle.stuck_power_max_pct", (int, float), 35.0,
            "Without GPM (older GPUs, VMs, MIG): utilization at or above util_stuck_pct with power at or below "
            "this share of the GPU's enforced power limit (nvmlDeviceGetEnforcedPowerLimit) and link traffic at "
            "or below stuck_link_max_kbs counts towards a stuck collective. H200: 127-136 W of 700 W (18-19 %) "
            "hung or spinning, 690 W training.", _idle("stuck_power_max_pct"), "0-100"),
    Setting("idle.stuck_link_max_kbs", (int, float), 8192.0,
            "Without GPM: PCIe tx + rx (nvmlDeviceGetPcieThroughput) plus NVLink throughput where read, KB/s, at "
            "or below which a GPU moves no data (H200 with tiny kernels: ~3,900 KB/s; training: ~23,000 KB/s).",
            _idle("stuck_link_max_kbs"), "0-1000000000"),
    Setting("idle.exempt_partitions", list, [], "Partitions whose jobs are never cancelled for idling.",
            _idle("exempt_partitions"), "partition names"),
    Setting("idle.exempt_qos", list, [], "QOS whose jobs are never cancelled for idling.", _idle("exempt_qos"),
            "QOS names"),
    Setting("idle.exempt_users", list, [], "Users whose jobs are never cancelled for idling.",
            _idle("exempt_users"), "user names"),
    Setting("idle.exempt_accounts", list, [], "Accounts whose jobs are never cancelled for idling.",
            _idle("exempt_accounts"), "account names"),
    Setting("idle.interactive_grace_min", (int, float), 60.0,
            "Extra idle minutes before an interactive job (salloc, srun --pty) is cancelled: its limit is "
            "cancel_after_min + this.", _idle("interactive_grace_min"), "0-100000"),
    Setting("idle.alert_mail", bool, True,
            "Mail the job's user when an idle / stuck / never-used GPU is detected: once per kind, again "
            "only after that kind cleared.", None,
            "true/false"),
    Setting("idle.mail_per_user_per_hour", int, 3, "Most idle alert mails per user per hour.",
            _idle("mail_per_user_per_hour"), "0-1000"),
    Setting("idle.touch_comment", bool, False,
            "Also note a detection in the job's Comment (off: the job's Comment and stderr are left alone).",
            None, "true/false"),
    Setting("report.js1_max_chars", int, 32768,
            "Longest JS1 blob stored in a job's AdminComment (jobstats' layout); a larger job's per-GPU, then "
            "per-node figures are pooled (min/median/max, node groups) so it fits. The default keeps a 64-node "
            "job of 8 GPUs each unreduced (about 14 k characters).", _range(2048, 49152), "2048-49152"),
    Setting("report.js1_short_s", (int, float), 60,
            "Jobs that ran less than this many seconds get jobstats' marker JS1:Short in AdminComment instead of "
            "a blob. The default is jobstats' own rule (2 x its 30 s sampling period); 0 stores a blob for every "
            "job with figures (gsrun samples every sampler.interval_s).", _range(0, 3600), "0-3600"),
    Setting("report.doc_url", str, "",
            "Site documentation page linked from every finding (the finding code as #anchor); empty = no link.",
            _url, "http(s) URL or empty"),
    Setting("cluster_report.zero_util_pct", (int, float), 0.0,
            "gsrun-report: a GPU whose mean utilization is at most this counts at 0 %.", _range(0, 100), "0-100"),
    Setting("cluster_report.min_gpu_hours", (int, float), 1.0,
            "gsrun-report: fewest GPU-hours for a user to be listed for low efficiency or long time limits.",
            _range(0, 1e6), "0-1000000"),
    Setting("cluster_report.mig_headroom_pct", (int, float), 20.0,
            "gsrun-report: room a MIG slice must leave above a job's GPU memory peak and SM activity.",
            _range(0, 400), "0-400"),
    Setting("cluster_report.cores_per_gpu", (int, float), 0,
            "gsrun-report: a node's CPU cores per GPU (0 = each partition's node from sinfo).",
            _range(0, 4096), "0-4096"),
    Setting("cluster_report.mem_per_gpu_gib", (int, float), 0,
            "gsrun-report: a node's memory per GPU in GiB (0 = each partition's node from sinfo).",
            _range(0, 1 << 20), "0-1048576"),
    Setting("cluster_report.top", int, 20, "gsrun-report: rows per ranked table.", _range(1, 10000), "1-10000"),
    Setting("cluster_report.chunk_h", (int, float), 24.0,
            "gsrun-report: hours of accounting asked of sacct at once.", _range(1, 24 * 31), "1-744"),
    Setting("cluster_report.sacct_timeout_s", (int, float), 120.0,
            "gsrun-report: seconds one chunk's sacct query may take before the report stops with an error.",
            _range(1, 86400), "1-86400"),
    Setting("cluster_report.digest_min_interval_h", (int, float), 144.0,
            "gsrun-report --email: no digest to a user who had one less than this many hours ago.",
            _range(0, 24 * 366), "0-8784"),
    Setting("cluster_report.digests_per_run", int, 500, "gsrun-report --email: most digests per run.",
            _range(0, 100000), "0-100000"),
    Setting("mail.enabled", bool, True, "Mail the report when the job asked for END/ALL mail.", None, "true/false"),
    Setting("mail.policy", str, "job",
            "job: mail when the job asked (--mail-type END/ALL); always: every job with a MailUser; never.",
            lambda v: None if v in ("job", "always", "never") else "must be job, always or never",
            "job|always|never"),
    Setting("mail.from_addr", str, "gsrun@localhost", "From: address.", _email, "email address"),
    Setting("mail.default_domain", str, "",
            "Domain appended to a bare MailUser (\"user1\" -> \"user1@<domain>\"); empty = bare names are not mailed.",
            _host, "domain name or empty"),
    Setting("mail.smtp_host", str, "localhost", "SMTP server.", _host, "host name"),
    Setting("mail.smtp_port", int, 25, "SMTP port.", _range(1, 65535), "1-65535"),
    Setting("mail.starttls", bool, False, "Use STARTTLS.", None, "true/false"),
    Setting("mail.username", str, "", "SMTP AUTH user (empty = no auth).", _line, "one-line string"),
    Setting("mail.password_file", str, "", "File holding the SMTP password (root-only).", _opt_abs_path,
            "absolute path"),
    Setting("mail.mailprog", str, "", "Use this MailProg (e.g. /usr/sbin/sendmail) instead of SMTP.",
            _opt_abs_path, "absolute path"),
    Setting("mail.max_attempts", int, 48, "Delivery attempts before a message is moved to failed/.",
            _range(1, 10000), "1-10000"),
    Setting("timeouts.command_s", (int, float), 15.0,
            "Timeout for each external command (nvidia-smi, scontrol, numactl, ...).", _range(0.5, 600), "0.5-600"),
    Setting("timeouts.prolog_budget_s", (int, float), 60.0,
            "Hard wall-time budget of the prolog; keep under PrologEpilogTimeout.", _range(1, 3600), "1-3600"),
    Setting("timeouts.epilog_budget_s", (int, float), 90.0,
            "Hard wall-time budget of the epilog; keep under PrologEpilogTimeout.", _range(1, 3600), "1-3600"),
)

_BY_KEY = {s.key: s for s in SETTINGS}
SECTIONS = sorted({s.key.split(".")[0] for s in SETTINGS})


class Config:
    """Effective settings. ``cfg["sampler.interval_s"]`` or
    ``cfg.get("tuning.defaults", partition="gpu")`` (partition overrides);
    ``Config()``: the built-in defaults."""

    def __init__(self, values: dict[str, Any] | None = None, partitions: dict[str, dict[str, Any]] | None = None,
                 source: str = "<defaults>"):
        self._values = {s.key: s.default for s in SETTINGS} if values is None else values
        self.partitions = partitions or {}
        self.source = source

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def get(self, key: str, partition: str | None = None) -> Any:
        if partition and key in self.partitions.get(partition, {}):
            return self.partitions[partition][key]
        return self._values[key]

    def effective(self, partition: str | None = None) -> dict[str, Any]:
        return {k: self.get(k, partition) for k in self._values}


def _check_value(key: str, value: Any, where: str) -> Any:
    s = _BY_KEY[key]
    types = s.type if isinstance(s.type, tuple) else (s.type,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        problem = " is not " + "/".join(t.__name__ for t in types)
    else:
        problem = s.check(value) if s.check else None
        problem = problem and f": {problem}"
    if problem:
        raise ConfigError("config", f"bad value for {key}", f"{value!r} in {where}{problem}",
                          hint=f"allowed: {s.allowed}")
    if float in types and isinstance(value, int):
        value = float(value)
    return value


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse TOML text strictly into a :class:`Config`.

    Raises:
        ConfigError: TOML syntax error, unknown section/key, wrong type, or a
            value outside the allowed range; the message names the key.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", "TOML syntax", f"{source}: {e}") from None
    values = {s.key: s.default for s in SETTINGS}
    partitions: dict[str, dict[str, Any]] = {}
    for section, table in data.items():
        if section == "partition":
            if not isinstance(table, dict):
                raise ConfigError("config", "bad section", "[partition] must hold [partition.<name>] tables")
            for pname, ptable in table.items():
                if not is_partition(pname):
                    raise ConfigError("config", "bad partition name", repr(pname))
                partitions[pname] = {}
                for sec, sub in ptable.items():
                    if not isinstance(sub, dict):
                        raise ConfigError("config", "bad key", f"partition.{pname}.{sec} must be a table")
                    for k, v in sub.items():
                        key = f"{sec}.{k}"
                        s = _BY_KEY.get(key)
                        if s is None or not s.per_partition:
                            allowed = sorted(x.key for x in SETTINGS if x.per_partition)
                            raise ConfigError("config", "unknown key", f"partition.{pname}.{key}",
                                              hint=f"per-partition keys: {', '.join(allowed)}")
                        partitions[pname][key] = _check_value(key, v, f"[partition.{pname}.{sec}]")
            continue
        if section not in SECTIONS:
            raise ConfigError("config", "unknown section", f"[{section}] in {source}",
                              hint=f"sections: {', '.join(SECTIONS + ['partition'])}")
        if not isinstance(table, dict):
            raise ConfigError("config", "bad section", f"{section} must be a table")
        for k, v in table.items():
            key = f"{section}.{k}"
            if key not in _BY_KEY:
                known = sorted(x.key.split('.', 1)[1] for x in SETTINGS if x.key.startswith(section + "."))
                raise ConfigError("config", "unknown key", f"{key} in {source}",
                                  hint=f"keys of [{section}]: {', '.join(known)}")
            values[key] = _check_value(key, v, source)
    return Config(values, partitions, source)


def config_path(path: str | None = None, environ=None) -> tuple[str, bool]:
    """(config file, named explicitly): ``path``, else ``$GSRUN_CONFIG``, else
    an existing ``gsrun.toml`` beside ``$SLURM_CONF``, else ``/etc/gsrun/gsrun.toml``."""
    environ = os.environ if environ is None else environ
    explicit = path or environ.get(ENV_CONFIG)
    if explicit:
        return explicit, True
    slurm_conf = environ.get("SLURM_CONF")
    if slurm_conf and os.path.isabs(slurm_conf):
        beside = os.path.join(os.path.dirname(slurm_conf), "gsrun.toml")
        if os.path.isfile(beside):
            return beside, False
    return DEFAULT_CONFIG_PATH, False


def load_config(path: str | None = None, environ=None) -> Config:
    """Load the file :func:`config_path` names; built-in defaults when absent.

    Raises:
        ConfigError: as :func:`parse_config`, or an explicitly named file is missing.
    """
    name, explicit = config_path(path, environ)
    p = os.fspath(name)
    try:
        with open(p) as f:
            text = f.read()
    except FileNotFoundError:
        if explicit:
            raise ConfigError("config", "file not found", p,
                              hint=f"unset {ENV_CONFIG} or create the file (gsrun-node install)") from None
        return Config()
    except OSError as e:
        raise ConfigError("config", "cannot read", f"{p}: {e.strerror}") from None
    return parse_config(text, p)


def load_config_or_defaults(log=None, path: str | None = None) -> Config:
    """:func:`load_config` for the Slurm hooks: a broken site config is logged
    and the built-in defaults are used (a config typo must not drain every node)."""
    try:
        return load_config(path)
    except ConfigError as e:
        if log is not None:
            log.error(f"{e}; using built-in defaults".replace("\n", " "))
        return Config()


def render_commented_config() -> str:
    """The commented ``gsrun.toml`` that ``gsrun-node install`` writes: every
    setting, its default and meaning, all commented out."""
    lines = ["# gsrun site configuration. Every setting is shown with its default, commented out.",
             "# Check with: gsrun-node config check", ""]
    current = None
    for s in SETTINGS:
        sec, name = s.key.split(".", 1)
        if sec != current:
            lines += ["", f"[{sec}]"]
            current = sec
        lines.append(f"# {s.meaning}")
        lines.append(f"# allowed: {s.allowed}" + ("   (per-partition)" if s.per_partition else ""))
        lines.append(f"# {name} = {_toml_value(s.default)}")
    lines += ["", "# Per-partition overrides, e.g.:", "# [partition.gpu.tuning]",
              "# defaults = \"governor=performance,swappiness=10\"", ""]
    return "\n".join(lines)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)


def idle_config(cfg: "Config"):
    """The ``[idle]`` table as a :class:`gsrun.request.waste.IdleConfig`."""
    return IdleConfig.from_table({k: v for k, v in cfg.effective().items() if k.startswith("idle.")})
