"""helpers.measure.calibration: plausible ceilings, measured once per process. Only what holds on any machine
(and under load) is asserted: magnitudes, the cache, and read-only bandwidth beside copy bandwidth."""

import dataclasses
import json
import time

import pytest
import torch

from helpers.measure.calibration import Calibration, calibrate, cpu_name, last_level_cache_bytes


@pytest.fixture(scope="module")
def cal() -> Calibration:
    return calibrate("cpu")


def test_ceilings_are_plausible(cal):
    assert 1e8 < cal.peak_flops < 1e16  # 0.1 GFLOP/s .. 10 PFLOP/s
    for bandwidth in (cal.read_bandwidth, cal.copy_bandwidth, cal.cache_read_bandwidth, cal.read_bandwidth_all_threads):
        assert 1e8 < bandwidth < 1e13  # 0.1 GB/s .. 10 TB/s


def test_read_only_beside_copy(cal):
    # the same bytes, timed in turn: a sum reads each byte once, a copy reads and writes it, counted twice; a
    # read-only stream is never much slower than half the traffic a copy moves
    assert cal.read_bandwidth >= 0.5 * cal.copy_bandwidth


def test_buffers_are_sized_by_the_cache(cal):
    assert cal.dram_bytes >= 256 * 2**20 and cal.cache_bytes < cal.dram_bytes
    if cal.last_level_cache:
        assert cal.dram_bytes >= min(4 * cal.last_level_cache, 2**30) and cal.cache_bytes <= cal.last_level_cache


def test_read_roof_picks_the_cache_for_what_fits_it(cal):
    assert cal.read_roof(10 * cal.dram_bytes) == cal.read_bandwidth and not cal.fits_in_cache(10 * cal.dram_bytes)
    if cal.last_level_cache:
        assert cal.fits_in_cache(cal.cache_bytes) and cal.read_roof(cal.cache_bytes) == cal.cache_read_bandwidth
    unknown = Calibration(**{**cal.__dict__, "last_level_cache": None})
    assert unknown.read_roof(1) == cal.read_bandwidth  # no cache size known: main memory's roof


def test_measured_once_per_process_and_thread_count(cal):
    t0 = time.perf_counter()
    again = calibrate("cpu")
    assert again is cal and time.perf_counter() - t0 < 0.05
    assert cal.threads == torch.get_num_threads()  # and measuring left torch's thread count as it was


def test_summary_is_one_line_naming_the_machine(cal):
    line = cal.summary()
    assert "\n" not in line and cal.cpu in line and cal.isa in line
    assert f"{cal.threads} of {cal.all_threads} threads" in line and "GFLOP/s" in line and "GB/s" in line
    assert cal.isa == torch.backends.cpu.get_cpu_capability()


def test_machine_description():
    assert cpu_name()
    llc = last_level_cache_bytes()
    assert llc is None or llc >= 2**16


def test_a_run_file_shares_one_calibration(cal, tmp_path, monkeypatch):
    # scripts/run_notebooks.py points LLM_COURSE_CALIBRATION at one file: the first kernel writes it, the
    # others read the same figures; a file from another CPU or thread count is measured over
    from helpers.measure import calibration

    shared = tmp_path / "calibration.json"
    fake = Calibration(**{**cal.__dict__, "peak_flops": 123.0})
    shared.write_text(json.dumps(dataclasses.asdict(fake)))
    monkeypatch.setenv(calibration.RUN_FILE_VARIABLE, str(shared))
    calibration._calibrate.cache_clear()
    try:
        assert calibrate("cpu").peak_flops == 123.0  # read, not measured
        calibration._calibrate.cache_clear()
        shared.write_text(json.dumps({**dataclasses.asdict(fake), "threads": fake.threads + 1}))
        again = calibrate("cpu")
        assert again.peak_flops != 123.0 and json.loads(shared.read_text())["threads"] == again.threads
    finally:
        calibration._calibrate.cache_clear()
