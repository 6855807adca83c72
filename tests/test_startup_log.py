"""What a start-up says while it works: the model's load time, and a note while the CUDA kernels
compile (a first start in an environment took ~75 s on an H100 and printed nothing meanwhile)."""
import logging
import time
import types

from minillm.backends.cuda_ops import CudaBackend
from minillm.llm import LLM


def test_engine_logs_the_models_load_time(tiny, caplog):
    with caplog.at_level(logging.INFO, logger="minillm"):
        LLM(str(tiny), device="cpu", max_model_len=64, max_num_seqs=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "minillm"]
    loaded = [m for m in lines if m.startswith("loaded ") and m.endswith(" s")]
    assert len(loaded) == 1, lines
    ready = next(i for i, m in enumerate(lines) if m.startswith("engine ready"))
    assert lines.index(loaded[0]) < ready


def test_a_slow_kernel_load_says_what_it_is_doing(caplog):
    """The note comes while the load runs (the timer fires from another thread), then how long it
    took; a quick load (warm cache) logs nothing."""
    seen_during = []

    def slow_load():
        time.sleep(0.5)
        seen_during.extend(r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.INFO, logger="minillm"):
        CudaBackend._load_kernels_logged(types.SimpleNamespace(_load_kernels=slow_load), quiet_s=0.1)
    assert any(m.startswith("compiling the CUDA kernels") for m in seen_during), seen_during
    assert caplog.records[-1].getMessage().startswith("CUDA kernels ready in ")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="minillm"):
        CudaBackend._load_kernels_logged(types.SimpleNamespace(_load_kernels=lambda: None), quiet_s=5.0)
    time.sleep(0.05)
    assert not caplog.records
