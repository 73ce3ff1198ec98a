"""A bad kernel launch setting is a `ValueError` naming the field and its range when the
`KernelConfig` is built, never an error inside a kernel's compilation or launch."""
import pytest

from tpsample.kernels.launcher import KernelConfig

BAD = [("block", 100), ("scan_cols", 3), ("plain_scan_cols", -512), ("cap", 1 << 17), ("small", 6),
       ("pivots", 512), ("bins", 3), ("hist_bins", 1000), ("num_warps", 64), ("hist_warps", 3), ("hist_block", 0),
       ("splits", 3), ("lean_block", 0), ("lean_read_cols", 24), ("block", True), ("block", 256.0),
       ("bracket_all", -1), ("force", {"lean"}), ("force", "bracket"), ("list_room", 0), ("list_room", 2.5),
       ("list_warps", 3), ("list_warps", 64), ("list_groups", 3), ("list_groups", 64), ("draw_scan_cols", 100)]


@pytest.mark.parametrize(("field", "value"), BAD)
def test_a_bad_launch_setting_names_its_field(field, value):
    with pytest.raises(ValueError, match=rf"KernelConfig\.{field} must be"):
        KernelConfig(**{field: value})


def test_small_above_cap_is_refused():
    with pytest.raises(ValueError, match=r"KernelConfig\.small must be <= cap \(8\), got 16"):
        KernelConfig(cap=8, small=16)


def test_the_defaults_and_the_optional_settings_are_accepted():
    KernelConfig()
    KernelConfig(splits=None, hist_block=None, hist_warps=None, list_warps=None, draw_scan_cols=None)
    KernelConfig(force={"bracket", "unpacked"})
    KernelConfig(list_warps=32, hist_warps=1)
    KernelConfig(splits=1, block=1, cap=1, small=1, pivots=1, bins=1, hist_bins=1, bracket_all=0)


def test_settings_are_keywords_only():
    with pytest.raises(TypeError):
        KernelConfig(256)
