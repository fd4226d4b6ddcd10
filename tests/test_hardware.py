"""mshelpers.hardware: profiles measured (Hardware.from_measurement gives back the measured collective time, every
field and source exactly) and cited (every figure with its source; one Ascend table for every module), and a
hand-made profile priced at its own figures.
"""
from __future__ import annotations


import pytest

from mshelpers import hardware
from mshelpers.collectives import AlphaBetaFit, collective_time, fit_alpha_beta
from mshelpers.hardware import REFERENCE_HARDWARE, Hardware
from _checks import module_doctests


def _rows(alpha, beta, sizes, op="all_reduce", noise=()):
    noise = list(noise) or [1.0] * len(sizes)
    return [{"op": op, "bytes": b, "seconds": (alpha + b / beta) * k, "ranks": 2} for b, k in zip(sizes, noise)]


SIZES = [4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20]


def _fit(op="all_reduce", ranks=2):
    return AlphaBetaFit(op=op, alpha_s=1e-4, beta_bytes_per_s=1e9, n_points=5, ranks=ranks, weighting="relative",
                        residuals=(), rms_rel_error=0.01, max_ratio=1.234)


def test_doctests():
    tries, failures = module_doctests(hardware)
    assert tries >= 3 and failures == 0


# ---------------------------------------------------------------- measured
def test_hardware_from_measurement_gives_back_the_measured_time():
    rows = _rows(4e-3, 9e7, SIZES)
    hw = Hardware.from_measurement(rows, peak_flops_per_device=2e11)
    assert hw.name == "this machine (measured)" and hw.devices_per_node == 2
    assert hw.intra_node_latency_s == pytest.approx(4e-3 / 2)          # alpha over the all-reduce's 2 passes
    # 2 ranks: a ring all-reduce sends 2(n-1)/n = 1 byte per buffer byte, so the link bandwidth is beta
    assert hw.intra_node_bytes_per_s == pytest.approx(9e7)
    for b in SIZES:
        assert collective_time("all_reduce", b, 2, hw) == pytest.approx(4e-3 + b / 9e7)
    assert "measured" in hw.source("intra_node_bytes_per_s") and "not measured" in hw.source("inter_node_bytes_per_s")
    assert {r["figure"] for r in hw.table()} >= {"peak_flops_per_device", "intra_node_bytes_per_s"}
    # 4 ranks: all-gather's (n-1)/n
    hw4 = Hardware.from_measurement(fit_alpha_beta(_rows(1e-3, 1e8, SIZES, op="all_gather"), "all_gather"),
                                    peak_flops_per_device=1e11, group_size=4)
    assert hw4.intra_node_bytes_per_s == pytest.approx(0.75e8)
    assert collective_time("all_gather", 1 << 20, 4, hw4) == pytest.approx(1e-3 + (1 << 20) / 1e8)
    with pytest.raises(ValueError, match="peak_flops_per_device"):
        Hardware.from_measurement(rows, peak_flops_per_device=0)


def test_hardware_from_measurement_sets_every_field_and_source_exactly():
    import dataclasses
    hw = Hardware.from_measurement(_fit(), peak_flops_per_device=2 * 10**11)
    assert hw == Hardware(peak_flops_per_device=2e11, intra_node_bytes_per_s=1e9, inter_node_bytes_per_s=1e9,
                          devices_per_node=2, compute_efficiency=1.0, intra_node_latency_s=5e-5,
                          inter_node_latency_s=5e-5, name="this machine (measured)", hbm_bytes_per_s=20e9,
                          memory_bytes=hw.memory_bytes, dp_overlap=0.0)
    assert type(hw.peak_flops_per_device) is float and hw.memory_bytes > 2**28 and hw.links_per_device == 1
    how = ("measured: all_reduce on 2 ranks, alpha-beta fit over 5 sizes (max pred/meas ratio 1.23); "
           "beta x 1 bytes sent per byte, alpha / 2 per pass")
    same = "not measured: all ranks on one machine; set equal to the intra-node figure"
    assert hw.sources == (("peak_flops_per_device", "measured"), ("intra_node_bytes_per_s", how),
                          ("intra_node_latency_s", how), ("inter_node_bytes_per_s", same),
                          ("inter_node_latency_s", same), ("devices_per_node", "ranks measured: 2"),
                          ("compute_efficiency", "1.0: the peak is already a measured matmul rate"),
                          ("hbm_bytes_per_s", "assumed 20 GB/s (the optimizer term only; not measured)"),
                          ("memory_bytes", "MemTotal of /proc/meminfo"))
    # the fit's ranks yield to group_size; 4-rank reduce-scatter sends 3/4 of a byte per buffer byte, in 1 pass
    hw4 = Hardware.from_measurement(_fit("reduce_scatter", ranks=None), peak_flops_per_device=1e11, group_size=4,
                                    compute_efficiency=0.5, name="box", peak_source="datasheet")
    assert (hw4.intra_node_bytes_per_s, hw4.devices_per_node, hw4.compute_efficiency, hw4.name) == (0.75e9, 4, 0.5, "box")
    assert hw4.intra_node_latency_s == 1e-4 and hw4.source("peak_flops_per_device") == "datasheet"
    assert hw4.source("intra_node_bytes_per_s").endswith("beta x 0.75 bytes sent per byte, alpha / 1 per pass")
    assert Hardware.from_measurement(_fit("broadcast", 8), peak_flops_per_device=1e11).intra_node_bytes_per_s == 1e9
    assert Hardware.from_measurement(_fit("all_reduce", 4), peak_flops_per_device=1e11).intra_node_bytes_per_s == 1.5e9
    # rows are fitted with the op asked for
    rows = _rows(4e-3, 9e7, SIZES, op="all_gather") + _rows(1e-3, 5e8, SIZES)
    assert Hardware.from_measurement(rows, peak_flops_per_device=1e11, op="all_gather").intra_node_latency_s == \
        pytest.approx(4e-3)
    assert Hardware.from_measurement(rows, peak_flops_per_device=1e11).intra_node_latency_s == pytest.approx(1e-3 / 2)
    # priced by the doctor as its profile of this CPU (2 ranks sharing the measured 4e11 FLOP/s)
    from mshelpers import doctor
    dh = doctor.cpu_hardware(2, alpha_beta=_fit(), peak=4e11)
    assert dataclasses.replace(hw.to_doctor()[0], name=dh.name, sources=dh.sources) == dh


@pytest.mark.parametrize("kw, line", [
    (dict(group_size=1), "Hardware.from_measurement: group_size=1; fix: pass group_size (the ranks measured)"),
    (dict(fit=_fit(ranks=None)), "Hardware.from_measurement: group_size=None; fix: pass group_size"),
    (dict(peak_flops_per_device=True), "Hardware.from_measurement: peak_flops_per_device=True; fix: pass a "
                                       "measured FLOP/s, e.g. mshelpers.peak.peak_flops()"),
    (dict(peak_flops_per_device="2e11"), "peak_flops_per_device='2e11'; fix"),
    (dict(peak_flops_per_device=-1.0), "peak_flops_per_device=-1.0; fix"),
])
def test_hardware_from_measurement_refusals(kw, line):
    fit = kw.pop("fit", _fit())
    with pytest.raises(ValueError) as e:
        Hardware.from_measurement(fit, **({"peak_flops_per_device": 1e11} | kw))
    assert line in str(e.value)


def test_a_sub_unit_peak_is_still_a_peak():
    assert Hardware.from_measurement(_fit(), peak_flops_per_device=0.5).peak_flops_per_device == 0.5


# ---------------------------------------------------------------- cited
@pytest.mark.parametrize("name", ["ascend-910b", "a100-sxm", "h100-sxm"])
def test_reference_profiles_cite_every_figure(name):
    hw = Hardware.reference(name)
    assert hw is REFERENCE_HARDWARE[name]
    for f in ("peak_flops_per_device", "intra_node_bytes_per_s", "inter_node_bytes_per_s", "devices_per_node"):
        src = hw.source(f)
        assert src != "assumed", f
        if f != "devices_per_node":
            assert "http" in src or "Hot Chips" in src, (f, src)
    assert hw.intra_node_bytes_per_s > hw.inter_node_bytes_per_s > 0
    with pytest.raises(ValueError, match="h100-sxm"):
        Hardware.reference("tpu")


def test_nvidia_figures_are_per_direction_datasheet_values():
    a, h = Hardware.reference("a100-sxm"), Hardware.reference("h100-sxm")
    assert (a.peak_flops_per_device, a.intra_node_bytes_per_s, a.inter_node_bytes_per_s) == (312e12, 300e9, 25e9)
    assert (h.peak_flops_per_device, h.intra_node_bytes_per_s, h.inter_node_bytes_per_s) == (989.4e12, 450e9, 50e9)
    assert "datasheet" in a.source("peak_flops_per_device") and "msmodeling" in \
        Hardware.reference("ascend-910b").source("peak_flops_per_device")


def test_one_ascend_table_serves_every_module():
    """parallel's 910B profile, peak's datasheet table and the doctor's Atlas 800T A2 profile are one table."""
    from mshelpers import doctor
    from mshelpers.peak import DATASHEET_PEAK_FLOPS
    p, d = Hardware.reference("ascend-910b"), doctor.hardware("atlas-800t-a2")
    # the view shows the bfloat16 peak the cookbook's models train at (353.9 TFLOPS), not float16's 376
    assert p.peak_dtype == "bfloat16"
    assert p.peak_flops_per_device == d.peak("bfloat16") == DATASHEET_PEAK_FLOPS["Ascend 910B"]["bfloat16"] == 353.9e12
    assert d.peak("float16") == DATASHEET_PEAK_FLOPS["Ascend 910B"]["float16"]
    fp16 = Hardware.from_doctor(d, doctor.CALIBRATION, dtype="float16")
    assert fp16.peak_flops_per_device == 376e12 and fp16.to_doctor()[0] is d and p.to_doctor()[0] is d
    # one table for the NVIDIA parts too: the planner's profiles quote peak's datasheet figures
    for ref, sheet in (("a100-sxm", "NVIDIA A100 SXM"), ("h100-sxm", "NVIDIA H100 SXM")):
        assert Hardware.reference(ref).peak_flops_per_device == DATASHEET_PEAK_FLOPS[sheet]["bfloat16"], ref
    assert p.intra_node_bytes_per_s == d.intra_link_bytes_per_s * d.links_per_device
    assert p.inter_node_bytes_per_s == d.inter_bytes_per_s and p.devices_per_node == d.devices_per_node
    assert p.compute_efficiency == pytest.approx(doctor.CALIBRATION.compute_efficiency, abs=1e-4)


# ---------------------------------------------------------------- by hand
def test_hardware_table_and_source_defaults():
    hw = Hardware(peak_flops_per_device=1.0, intra_node_bytes_per_s=2.0, inter_node_bytes_per_s=3.0,
                  sources=(("intra_node_bytes_per_s", "read off a cable"),))
    assert (hw.devices_per_node, hw.compute_efficiency, hw.intra_node_latency_s, hw.inter_node_latency_s, hw.name,
            hw.links_per_device, hw.hbm_bytes_per_s, hw.memory_bytes, hw.dp_overlap) == \
        (8, 0.5, 0.0, 0.0, "assumed", 1, 1e12, 64 * 2**30, 1.0)
    assert hw.source("intra_node_bytes_per_s") == "read off a cable" and hw.source("anything") == "assumed"
    row = lambda f, v, src="assumed": {"hardware": "assumed", "figure": f, "value": v, "source": src}
    assert hw.table() == [
        row("peak_flops_per_device", 1.0), row("intra_node_bytes_per_s", 2.0, "read off a cable"),
        row("links_per_device", 1), row("inter_node_bytes_per_s", 3.0), row("devices_per_node", 8),
        row("intra_node_latency_s", 0.0), row("inter_node_latency_s", 0.0), row("compute_efficiency", 0.5),
        row("hbm_bytes_per_s", 1e12), row("memory_bytes", 64 * 2**30)]
    # a hand-made profile is priced at its own figures: one peak for every dtype, no fitted constant but efficiency
    dh, cal = hw.to_doctor()
    assert (dh.peak("bfloat16"), dh.intra_link_bytes_per_s, dh.inter_bytes_per_s, dh.devices_per_node) == (1.0, 2.0, 3.0, 8)
    assert (cal.compute_efficiency, cal.comm_time_factor) == (0.5, 1.0)


def test_from_doctor_maps_every_figure_and_names_every_source():
    """A profile of distinct figures, so a field read into the wrong slot shows; sources and the calibration do not
    take part in Hardware's ==, so they are checked one by one."""
    import dataclasses
    from types import SimpleNamespace

    from mshelpers.doctor.profiles import DoctorHardware
    prof = DoctorHardware(name="X", peak_flops={"float16": 400.0, "bfloat16": 300.0}, hbm_bytes_per_s=7.0,
                          intra_link_bytes_per_s=5.0, links_per_device=3, inter_bytes_per_s=2.0, devices_per_node=4,
                          intra_latency_s=1e-6, inter_latency_s=3e-6, memory_bytes=11.0, dp_overlap=0.25,
                          sources={"peak": "P", "intra": "I", "inter": "E", "node": "N", "hbm": "H"})
    cal = SimpleNamespace(compute_efficiency=0.6, fitted_on=("a", "b"))
    h = Hardware.from_doctor(prof, cal)
    # the node's full mesh: 3 links of 5 B/s each per device
    assert h == Hardware(peak_flops_per_device=300.0, peak_dtype="bfloat16", intra_node_bytes_per_s=15.0,
                         inter_node_bytes_per_s=2.0, devices_per_node=4, compute_efficiency=0.6,
                         intra_node_latency_s=1e-6, inter_node_latency_s=3e-6, name="X", links_per_device=3,
                         hbm_bytes_per_s=7.0, memory_bytes=11.0, dp_overlap=0.25)
    assert h.calibration is cal and h.doctor_profile is prof
    assert h.sources == (("peak_flops_per_device", "P"), ("intra_node_bytes_per_s", "I"), ("links_per_device", "I"),
                         ("inter_node_bytes_per_s", "E"), ("intra_node_latency_s", "I"), ("inter_node_latency_s", "E"),
                         ("devices_per_node", "N"), ("hbm_bytes_per_s", "H"), ("memory_bytes", "N"),
                         ("compute_efficiency", "fitted: the doctor's calibration (a, b)"))
    # a profile that names no source, another dtype and a name of the caller's, no calibration
    bare = Hardware.from_doctor(dataclasses.replace(prof, sources={}), name="Y", dtype="float16")
    assert (bare.peak_flops_per_device, bare.peak_dtype, bare.name, bare.compute_efficiency, bare.calibration) == \
        (400.0, "float16", "Y", 1.0, None)
    assert bare.sources == tuple((k, "assumed") for k in (
        "peak_flops_per_device", "intra_node_bytes_per_s", "links_per_device", "inter_node_bytes_per_s",
        "intra_node_latency_s", "inter_node_latency_s", "devices_per_node", "hbm_bytes_per_s", "memory_bytes")) + (
        ("compute_efficiency", "1.0: no calibration given"),)


def test_to_doctor_carries_each_changed_figure_back_into_the_profile():
    import dataclasses

    from mshelpers import doctor as D
    from mshelpers.doctor.profiles import DoctorHardware
    prof = DoctorHardware(name="X", peak_flops={"float16": 400.0, "bfloat16": 300.0, "float32": 100.0},
                          hbm_bytes_per_s=7.0, intra_link_bytes_per_s=5.0, links_per_device=3, inter_bytes_per_s=2.0,
                          devices_per_node=4, intra_latency_s=1e-6, inter_latency_s=3e-6, memory_bytes=11.0,
                          dp_overlap=0.25, sources={"peak": "P"})
    view = Hardware.from_doctor(prof, D.CALIBRATION)
    hw, cal = view.to_doctor()
    assert hw is prof and cal is D.CALIBRATION                     # an unchanged view gives both back as they are
    moved = dataclasses.replace(view, peak_flops_per_device=600.0, inter_node_bytes_per_s=9.0, compute_efficiency=0.5)
    hw, cal = moved.to_doctor()
    # bfloat16 300 -> 600 doubles every dtype's peak (each keeps its ratio); the link figure replaced; the rest kept
    assert hw == dataclasses.replace(prof, peak_flops={"float16": 800.0, "bfloat16": 600.0, "float32": 200.0},
                                     inter_bytes_per_s=9.0)
    assert hw.sources == {"peak": "P"} and cal == dataclasses.replace(D.CALIBRATION, compute_efficiency=0.5)
    # a view of no profile: its own figures (3 links of 2 B/s make 6 per device) and its own sources
    plain = Hardware(peak_flops_per_device=10.0, intra_node_bytes_per_s=6.0, inter_node_bytes_per_s=1.0,
                     links_per_device=3, name="P", sources=(("peak_flops_per_device", "S"),))
    hw, cal = plain.to_doctor()
    assert (hw.name, hw.sources, hw.intra_link_bytes_per_s, hw.peak_flops) == (
        "P", {"peak_flops_per_device": "S"}, 2.0, {"float16": 10.0, "bfloat16": 10.0, "float32": 10.0})
    assert (cal.compute_efficiency, cal.comm_time_factor) == (0.5, 1.0)


def test_each_datasheet_figure_is_typed_once():
    """issue 58: peak's table is the one datasheet table; its 910B row is the doctor's own object, and the CPU
    peak of the doctor's profile is peak.cpu_peak_flops on the clock hardware_peak_flops uses."""
    import os
    from mshelpers import doctor, peak
    from mshelpers.doctor.profiles import ASCEND_910B_PEAK
    table = peak.DATASHEET_PEAK_FLOPS
    assert list(table) == list(table.keys()) == [k for k, _ in table.items()] == \
        ["Ascend 910A", "Ascend 910B", "NVIDIA A100 SXM", "NVIDIA H100 SXM"]
    assert table["Ascend 910B"] is ASCEND_910B_PEAK and table.get("Ascend 910B") is ASCEND_910B_PEAK
    for name in ("atlas-800t-a2", "atlas-900-a2-podc"):
        hw = doctor.hardware(name)
        assert (hw.peak("float16"), hw.peak("bfloat16")) == (376e12, 353.9e12)
    cpu = doctor.hardware("cpu")
    mhz, _ = peak.max_clock_mhz()
    assert cpu.peak("float32") == peak.cpu_peak_flops(os.cpu_count() or 1, mhz, peak.cpu_info())[0]
