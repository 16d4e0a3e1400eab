"""The report: text layout and wording, and the ``gseff --plot`` PNG."""

from __future__ import annotations

import dataclasses
import struct
import zlib


from gsrun.base.record import ABSENT
from gsrun.facts.nvml import FakeNvml, Seq
from gsrun.report.records import JobSummary
from gsrun.report.render import render_png, render_text

from helpers.sampler_sim import (GIB, SimClock, cpu_usage, energy_stream, h200_data, job_of, make_sampler,
                                  node_of, run_job, util_sample_stream)

H = 3600.0


def _job(tmp_path, lose_gpu: bool = True, nodes=("gpu-a01",), gpm=True):
    sums = []
    for name in nodes:
        n = 721
        fake = FakeNvml(h200_data(4))
        for i in range(4):
            fake.set(i, "util_samples", Seq(util_sample_stream(
                n, 5.0, lambda t, i=i: (100 if (t % (60 * (i + 1))) < 30 * (i + 1) else 10))))
            fake.set(i, "energy_mj", Seq(energy_stream(n, 5.0, lambda t, i=i: 150 + 100 * i)))
            fake.set(i, "power_mw", Seq([{"ok": int((150 + 100 * i + (k % 7) * 20) * 1000)} for k in range(n)]))
            fake.set(i, "memory", Seq([{"ok": {"total": 150754820096, "used": int(min(k, 300) / 300 * (20 + 25 * i) * GIB),
                                               "free": 0}} for k in range(n)]))
            if gpm:
                fake.set(i, "gpm", Seq([{"error": "first GPM sample", "code": None}] + [
                    {"ok": {"sm_active_pct": 40.0 + 10 * i + (k % 5), "sm_occupancy_pct": 10.0,
                            "tensor_active_pct": 20.0, "dram_bw_pct": 5.0}} for k in range(n)]))
        clock = SimClock()
        if lose_gpu:
            clock.at(1800, lambda fake=fake: fake.data["devices"][2].__setitem__("lost", True))
        st = run_job(make_sampler(tmp_path, fake, [0, 1, 2, 3], clock, node=name,
                                  usage=cpu_usage(clock, 6.0, 40 * GIB)), n)
        sums.append(node_of(st, H, cpus=16, gpus=[0, 1, 2, 3], node=name))
    return job_of(sums, H, cpus_alloc=16 * len(nodes), mem_req_bytes=128 * GIB * len(nodes),
                  gpus_alloc=4 * len(nodes), name="train-llm", user="alice", partition="gpu")


def _png_chunks(data: bytes):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        ctype = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(ctype + body) & 0xFFFFFFFF, ctype
        chunks.append((ctype, body))
        pos += 12 + length
    return chunks


def test_png_is_valid_with_expected_size(tmp_path, monkeypatch):
    import matplotlib.figure
    import matplotlib.text
    from gsrun.report.mail import build_message
    figs = []
    real_savefig = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figs.append(fig), real_savefig(fig, *a, **k))[1])
    job = _job(tmp_path)
    png = render_png(job)
    chunks = _png_chunks(png)
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, ctype = struct.unpack(">IIBB", chunks[0][1][:10])
    # drawn at 2x (7.2 in at 200 dpi = 1440 px), shown at 720 px; four panels of 1.55 in + 0.7 in
    assert (width, height) == (1440, 1380)
    # every piece of text on the chart is 11 pt or more (at 720 px shown: 11 pt at 100 dpi)
    (fig,) = figs
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]
    assert len(texts) > 10
    assert min(t.get_fontsize() for t in texts) >= 11, sorted({(t.get_fontsize(), t.get_text()) for t in texts})[:5]
    # the mail shows it at half its pixel size, with an explicit width and height
    msg = build_message(job, render_text(job), png, "alice@example.org", "gsrun@cluster.example.org", date=0)
    html = msg.get_body(("html",)).get_content()
    assert 'width="720" height="690"' in html
    assert depth == 8 and ctype in (2, 6)
    pixels = zlib.decompress(b"".join(b for t, b in chunks if t == b"IDAT"))
    bpp = 4 if ctype == 6 else 3
    assert len(pixels) == height * (1 + width * bpp)
    # not a blank picture: many distinct rows
    rows = {pixels[r * (1 + width * bpp):(r + 1) * (1 + width * bpp)] for r in range(0, height, 5)}
    assert len(rows) > 50
    (tmp_path / "timeline.png").write_bytes(png)


def test_png_none_without_gpu_figures(tmp_path):
    data = h200_data(1)
    data["init"] = {"error": "Driver/library version mismatch", "code": 18}
    st = run_job(make_sampler(tmp_path, None, [0], SimClock(), nvml=lambda: FakeNvml(data)), 5)
    assert render_png(job_of([node_of(st, 20, gpus=[0])], 20)) is None


def test_png_two_nodes_no_gpm(tmp_path):
    png = render_png(_job(tmp_path, lose_gpu=False, nodes=("gpu-a01", "gpu-a02"), gpm=False))
    assert _png_chunks(png)[0][0] == b"IHDR"


def test_text_report_layout_and_units(tmp_path):
    job = _job(tmp_path)
    text = render_text(job)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 76
    # the verdict first (title, the hardware alert, next time, one row per resource)
    assert lines[0] == "gsrun report: job 4242 (train-llm) COMPLETED after 01:00:00 on gpu-a01"
    assert lines[1] == "!! GPU 2 on gpu-a01 was lost 00:30:00 into the job and the node was flagged"
    assert lines[4:12] == [
        "Next time: nothing to change on the GPUs; CPU efficiency and host memory",
        "  could be better (below).",
        "GPU busy        55%  good             mean of 4 GPUs; lowest GPU 0: 55%",
        "GPU SM active   57%  good             share of the SMs in use",
        "GPU memory      68%  good             peak 95.0 of 140.4 GiB (GPU 3)",
        "CPU efficiency  38%  could be better  of 16 cores",            # 6 of 16 cores: 37.5 %
        "Host memory     31%  could be better  peak 40.0 of 128.0 GiB requested",   # 31.25 %
        ""]
    assert lines[12:14] == ["Findings",
                            "  !! Hardware event: GPU 2 on gpu-a01 was lost 00:30:00 into the job and the"]
    job_at = lines.index("Job")
    assert lines[job_at + 1:job_at + 5] == [
        "  User alice, partition gpu, exit code N/A",
        "  Ran 2025-10-09 08:53 to 09:53",
        "  1 node (gpu-a01), 16 CPUs, 4 GPUs, 128.0 GiB memory requested",
        "  CPU time 06:00:00 of 16 cores x 01:00:00; host memory peak 40.0 GiB"]
    # fewer than 5 GPUs: a block per GPU, memory in the total's unit, energy in Wh (150 W x 1 h)
    gpus_at = lines.index("GPUs")
    assert lines[gpus_at + 1:gpus_at + 4] == ["  gpu-a01 GPU 0, NVIDIA H200",
                                              "    busy 55%, SM active 42%, tensor active 20%",
                                              "    memory peak 20.0 of 140.4 GiB, power 150 W, energy 150 Wh"]
    assert lines[gpus_at + 7:gpus_at + 11] == ["  gpu-a01 GPU 2, NVIDIA H200",
                                               "    busy 55%, SM active 62%, tensor active 20%",
                                               "    memory peak 70.0 of 140.4 GiB, power 350 W, energy 175 Wh",
                                               "    lost 00:30:00 into the job"]
    assert "  GPU-hours busy 1.92 of 4.00 allocated; energy 1.02 kWh" in lines
    assert text.count("lost 00:30:00") == 3 and "1800 s" not in text and "LOST" not in text
    assert "\033[" not in text
    colored = render_text(job, color=True)
    assert "\033[1m" in colored and "\033[31m" in colored


def test_missing_figures_print_na_not_zero():
    job = JobSummary.from_json({
        "schema": "gsrun.summary/1", "kind": "job",
        "job": {"id": "9", "nodes": ["n1"], "elapsed_s": None, "cpus_alloc": None, "gpus_alloc": None},
        "cpu": {"time_s": None, "efficiency_pct": None, "source": None},
        "memory": {"peak_bytes": None, "req_bytes": None, "efficiency_pct": None, "source": None},
        "gpu": {"available": False, "reason": None, "count": 0, "devices": [], "gpu_hours_alloc": None,
                "gpu_hours_used": None, "energy_j": None, "energy_kwh": None},
        "findings": []})
    text = render_text(job)
    assert text.splitlines()[0] == "gsrun report: job 9 N/A on n1"      # state and elapsed unknown: no "after"
    assert "  CPU efficiency N/A, host memory peak N/A" in text.splitlines()
    assert "  User N/A, partition N/A, exit code N/A" in text.splitlines()
    assert "0%" not in text and "0.0" not in text and " 0 s" not in text and "00:00:00" not in text


def test_chart_draws_the_power_limit_nvml_reported(tmp_path, monkeypatch):
    """The H200 recording reports nvmlDeviceGetEnforcedPowerLimit 700000 mW: the
    node and job summaries carry power_limit_w 700.0 and the power panel draws
    it as a labelled horizontal line (a summary without it draws none)."""
    import matplotlib.figure
    import matplotlib.lines
    figs = []
    real_savefig = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figs.append(fig), real_savefig(fig, *a, **k))[1])
    job = _job(tmp_path)
    assert {d.power_limit_w for d in job.gpu.devices} == {700.0}

    def limit_lines(summary):
        figs.clear()
        assert render_png(summary)
        (fig,) = figs
        lines = [ln for ln in fig.findobj(matplotlib.lines.Line2D)
                 if len(set(ln.get_ydata())) == 1 and list(ln.get_ydata())[0] == 700.0]
        labels = [t.get_text() for t in fig.texts + [t for ax in fig.axes for t in ax.texts]]
        return lines, labels

    lines, labels = limit_lines(job)
    assert len(lines) == 1 and "power limit 700 W" in labels
    old = job.to_json()
    for d in old["gpu"]["devices"]:
        d.pop("power_limit_w")
    lines, labels = limit_lines(JobSummary.from_json(old))
    assert lines == [] and not any("power limit" in t for t in labels)


def test_chart_of_a_pooled_job_timeline(tmp_path, monkeypatch):
    """Past 16 GPUs the job summary keeps one pooled timeline (gpu.timeline)
    and no per-GPU ones: the chart draws its mean with the band from the lowest
    GPU mean to the highest sample, names the lowest GPUs, and keeps the
    memory total and the power limit."""
    import matplotlib.collections
    import matplotlib.figure
    from gsrun.report.summary import JobTimeline
    figs = []
    real_savefig = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figs.append(fig), real_savefig(fig, *a, **k))[1])
    job = _job(tmp_path, lose_gpu=False, nodes=("gpu-a01", "gpu-a02"))
    pool = JobTimeline()
    for d in job.gpu.devices:
        pool.add_gpu(d.timeline)
    devices = tuple(dataclasses.replace(d, timeline=ABSENT) for d in job.gpu.devices)
    job = dataclasses.replace(job, gpu=dataclasses.replace(job.gpu, devices=devices, timeline=pool.to_json()))
    png = render_png(job)
    assert png and png.startswith(b"\x89PNG")
    (fig,) = figs
    bands = [c for c in fig.findobj(matplotlib.collections.PolyCollection)
             if c.get_label() == "lowest GPU mean to highest sample"]
    assert len(bands) == len(fig.axes) == 4                     # busy, SM, memory, power
    labels = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "power limit 700 W" in labels and any(t.startswith("of 140 GiB") for t in labels)
    title = fig._suptitle.get_text()
    assert ": 8 GPUs, lowest busy: GPU 0 on gpu-a0" in title
    job = dataclasses.replace(job, gpu=dataclasses.replace(job.gpu, timeline={}))
    assert render_png(job) is None                              # nothing to draw: no picture
