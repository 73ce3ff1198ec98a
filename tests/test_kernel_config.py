"""A bad kernel launch setting is a `ValueError` naming the field and its range when the
`KernelConfig` is built, never an error inside a kernel's compilation or launch."""
import pytest

from tpsample.kernels.config import KernelConfig

BAD = [("block", 100), ("filter_block", 0), ("scan_cols", 3), ("plain_scan_cols", -512), ("cap", 1 << 17),
       ("small", 6), ("pivots", 512), ("bins", 3), ("hist_bins", 1000), ("num_warps", 64), ("scan_warps", 3),
       ("row_warps", 0), ("splits", 3), ("block_max_cols", 24), ("block", True), ("block", 256.0),
       ("programs_per_sm", 0), ("filter_programs_per_sm", -1), ("bracket_all", -1), ("lean", 1),
       ("list_pack", "yes"), ("list_room", 0), ("list_room", 2.5), ("list_warps", 3), ("list_warps", 64),
       ("list_groups", 3), ("list_groups", 64), ("draw_scan_cols", 100), ("draw_scan_warps", 64),
       ("list_regs", 100), ("list_regs", 256), ("list_regs", 0), ("list_regs", 128.0),
       ("hist_regs", 60), ("hist_regs", 512)]


@pytest.mark.parametrize(("field", "value"), BAD)
def test_a_bad_launch_setting_names_its_field(field, value):
    with pytest.raises(ValueError, match=rf"KernelConfig\.{field} must be"):
        KernelConfig(**{field: value})


def test_small_above_cap_is_refused():
    with pytest.raises(ValueError, match=r"KernelConfig\.small must be <= cap \(8\), got 16"):
        KernelConfig(cap=8, small=16)


def test_the_defaults_and_the_optional_settings_are_accepted():
    KernelConfig()
    KernelConfig(splits=None, filter_programs_per_sm=None, block_max_cols=None, list_regs=None)
    KernelConfig(list_regs=8, hist_regs=64)
    KernelConfig(list_regs=248)
    KernelConfig(splits=1, block=1, filter_block=1, cap=1, small=1, pivots=1, bins=1, hist_bins=1, bracket_all=0)


def test_settings_are_keywords_only():
    with pytest.raises(TypeError):
        KernelConfig(256)
