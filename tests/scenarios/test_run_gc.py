"""The garbage collector's settings while a run simulates (``scenarios.runner._prepared_frozen``): what
exists before is frozen, the youngest generation is collected less often, and both are handed back."""

import gc

from scenarios.runner import RUN_GC_THRESHOLD0, _prepared_frozen


def test_a_run_freezes_and_raises_the_young_threshold_then_restores_both():
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with _prepared_frozen():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (max(before[0], RUN_GC_THRESHOLD0), *before[1:])
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_caller_that_froze_objects_keeps_its_settings():
    before = gc.get_threshold()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with _prepared_frozen():
            assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
