"""The report: text layout and wording, and the ``gseff --plot`` PNG."""

from __future__ import annotations

import struct
import zlib

import pytest

from gsrun.facts.nvml import FakeNvml, Seq
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


def test_png_is_valid_with_expected_size(tmp_path):
    job = _job(tmp_path)
    png = render_png(job)
    chunks = _png_chunks(png)
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, ctype = struct.unpack(">IIBB", chunks[0][1][:10])
    assert (width, height) == (810, 765)                    # 9 x 8.5 in at 90 dpi
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
    assert lines[0] == "gsrun efficiency report: job 4242 (train-llm)"
    assert "User: alice   Partition: gpu   State: COMPLETED" in lines[1]
    assert "Elapsed: 01:00:00   CPUs: 16   GPUs: 4" in text
    assert "CPU efficiency: 37.5% (06:00:00 CPU time of 16 cores x 01:00:00)" in text
    assert "Memory high water: 40.0 GiB of 128.0 GiB requested (31.2%)" in text
    header = [ln for ln in lines if "memory high water" in ln][0]
    for col in ("util", "SM act", "tensor", "energy", "power", "throttled"):
        assert col in header
    rows = [ln for ln in lines if ln.startswith("  gpu-a01")]
    assert len(rows) == 4
    assert "LOST at 1800 s" in rows[2] and "LOST" not in rows[0]
    assert "45.0 GiB / 140.4 GiB" in rows[1]
    assert "150 W" in rows[0] and "150 Wh" in rows[0]            # 150 W x 1 h
    assert "GPU-hours:" in text and "of 4.00 allocated" in text and "Energy: " in text
    assert "kWh" in text
    assert "Findings" in text and "!! Hardware event: GPU 2 on gpu-a01 was lost 1800 s into the job" in text
    assert "\033[" not in text
    colored = render_text(job, color=True)
    assert "\033[1m" in colored and "\033[31m" in colored


def test_missing_figures_print_na_not_zero():
    job = {"schema": "gsrun.summary/1", "kind": "job",
           "job": {"id": "9", "nodes": ["n1"], "elapsed_s": None, "cpus_alloc": None, "gpus_alloc": None},
           "cpu": {"time_s": None, "efficiency_pct": None, "source": None},
           "memory": {"peak_bytes": None, "req_bytes": None, "efficiency_pct": None, "source": None},
           "gpu": {"available": False, "reason": None, "count": 0, "devices": [], "gpu_hours_alloc": None,
                   "gpu_hours_used": None, "energy_j": None, "energy_kwh": None},
           "findings": []}
    text = render_text(job)
    assert "CPU efficiency: N/A" in text and "Memory high water: N/A" in text and "Elapsed: N/A" in text
    assert "0.0%" not in text
