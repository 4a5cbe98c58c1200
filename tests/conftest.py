import hashlib
import os
import sys
import tempfile
from pathlib import Path

# No test may reach the Hub: offline mode and an empty private cache. Set before
# anything imports huggingface_hub, which reads these once at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="specfmt-test-hf-")
os.environ.pop("HF_HUB_CACHE", None)

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under a folder, to prove inputs are never modified."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}
