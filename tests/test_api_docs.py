"""docs/api.md's examples: one script, run from a fresh interpreter on the built-in emoji corpus; each job returns
its result dataclass."""

import re
import subprocess
import sys
from pathlib import Path

from conftest import needs_emoji_data

DOCS = Path(__file__).resolve().parents[1] / "docs" / "api.md"

# what each example's names must be, checked after the script ran
CHECKS = """
import openalign
from openalign.config import Config
expected = {"config": Config, "run": openalign.TrainResult, "model": openalign.Model, "result": openalign.EvalResult,
            "pairs": openalign.IngestResult, "kept": openalign.FilterResult, "clean": openalign.DedupResult,
            "screened": openalign.ScreenResult, "shards": openalign.ShardResult, "emb": openalign.EmbedResult,
            "grown": openalign.EmbedResult, "index": openalign.IndexResult, "hits": openalign.SearchResult,
            "by_image": openalign.SearchResult, "added": openalign.IndexResult, "taken_down": openalign.IndexResult}
wrong = {name: type(globals().get(name)).__name__ for name, kind in expected.items()
         if not isinstance(globals().get(name), kind)}
assert not wrong, wrong
assert all(isinstance(hit, openalign.Hit) for hit in hits) and len(hits) == 5
assert run.step == 30 and result.metrics["n_skipped"] == 0 and {"i2t_r1", "zeroshot_top1"} <= set(result.metrics)
assert pairs.pairs > 0 and kept.pairs == pairs.pairs and 0 < shards.samples <= pairs.images
assert index.count == emb.count and added.added == grown.count - emb.count and taken_down.newly_deleted == 1
assert len(by_image) == 3 and taken_down.deleted >= 1
print("checked", len(expected))
"""


def examples() -> str:
    return "\n".join(re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S))


def as_script(code: str) -> str:
    """`code` under `if __name__ == "__main__":`, as docs/api.md says a script runs it (the stages' worker processes
    import the main module)."""
    return 'if __name__ == "__main__":\n' + "".join(f"    {line}\n" if line.strip() else "\n"
                                                 for line in code.splitlines())


def test_every_example_is_python():
    blocks = [language for language, _ in re.findall(r"```(\w*)\n(.*?)```", DOCS.read_text(), re.S)]
    assert blocks and set(blocks) == {"python"}, blocks
    compile(examples(), str(DOCS), "exec")


@needs_emoji_data
def test_the_api_examples_run_from_a_fresh_interpreter(tmp_path):
    script = tmp_path / "api_examples.py"
    script.write_text(as_script(examples() + CHECKS))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().endswith("checked 16")
