"""models.monai_core: MONAI's networks, losses and metrics without MONAI's optional extras."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import models.monai_core as core
loaded_after_monai = sorted(m for m in core.HIDDEN_FROM_MONAI if m in sys.modules)
import pandas, mlflow, matplotlib  # still importable by anybody else
from monai.utils import optional_import
_, monai_sees_pandas = optional_import("pandas")
print(json.dumps({"monai": "monai" in sys.modules, "hidden_loaded": loaded_after_monai,
                  "pandas_later": pandas.__name__, "monai_sees_pandas": monai_sees_pandas}))
"""


def test_monai_is_imported_without_its_optional_extras_which_stay_importable():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    probe = json.loads(out.strip().splitlines()[-1])
    assert probe["monai"] is True
    # Without the hiding, `import monai` loads matplotlib, pandas, mlflow, sklearn, scipy...
    # (SciPy and Pillow may still come with nibabel and pydicom, which MONAI imports.)
    assert not {"matplotlib", "pandas", "mlflow", "sklearn"} & set(probe["hidden_loaded"]), probe
    assert probe["pandas_later"] == "pandas"
    # Outside MONAI's own import nothing is hidden: its optional_import finds pandas now.
    assert probe["monai_sees_pandas"] is True


def test_the_imported_parts_work():
    import torch  # noqa: PLC0415

    from models.monai_core import DiceMetric, UNet, compute_roc_auc  # noqa: PLC0415

    net = UNet(spatial_dims=2, in_channels=1, out_channels=1, channels=(4, 8), strides=(2,))
    assert tuple(net(torch.zeros(2, 1, 16, 16)).shape) == (2, 1, 16, 16)
    assert float(compute_roc_auc(torch.tensor([0.1, 0.9]), torch.tensor([0, 1]))) == 1.0
    metric = DiceMetric(include_background=True)
    metric(torch.ones(1, 1, 4, 4), torch.ones(1, 1, 4, 4))
    assert float(metric.aggregate()) == 1.0
