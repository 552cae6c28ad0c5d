"""The pipeline example of the API docs (``service/example_pipeline_stats.json``), made by today's collector.

Run ``python tests/service/docs/make_example_pipeline_stats.py`` after a change to what the collector writes
for a pipeline stage. The model is a two-layer Llama of random weights (hidden 64, vocabulary 256), cut into
two stages under 1F1B with four microbatches: small enough for Swagger UI to show whole. The file holds
``{"stages": [stage 0's stats, stage 1's stats]}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "service" / "example_pipeline_stats.json"
CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}
COMMAND = ["--batch", "1", "--seq", "32", "--pp-stages", "2", "--pp-schedule", "1f1b", "--microbatches", "4",
           "--optimizer", "adamw", "--target-device", "A100-80GB"]


def collect() -> dict:
    """The example as ``sacplan collect --pp-stages 2`` writes it now."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tiny_llama.json"
        config.write_text(json.dumps(CONFIG))
        out = Path(tmp) / "stats.json"
        subprocess.run([sys.executable, "-m", "planner.cli", "collect", "--hf-config", str(config), *COMMAND,
                        "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
        return {"stages": [json.loads((Path(tmp) / f"stats.stage{k}.json").read_text()) for k in (0, 1)]}


if __name__ == "__main__":
    EXAMPLE.write_text(json.dumps(collect(), indent=1) + "\n")
    print(f"wrote {EXAMPLE.relative_to(ROOT)}")
