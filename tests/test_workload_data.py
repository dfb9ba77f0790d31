"""The weights hash needs torch only: `pip install -e .` brings no numpy."""

import subprocess
import sys

import torch

from gpuyard.jobs.workload.data import build_model, weights_sha256

NO_NUMPY = "import sys; sys.modules['numpy'] = None\n"


def test_weights_sha256_is_the_same_without_numpy():
    script = NO_NUMPY + "from gpuyard.jobs.workload.data import build_model, weights_sha256\n" \
                        "print(weights_sha256(build_model('mlp', 7)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == weights_sha256(build_model("mlp", 7))


def test_weights_sha256_covers_every_tensor_byte():
    model = build_model("linear", 0)
    before = weights_sha256(model)
    with torch.no_grad():
        model.bias.view(-1)[-1:].add_(1e-7)
    assert weights_sha256(model) != before
