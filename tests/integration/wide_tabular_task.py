"""A test-only task: the tabular-cls task with a wide MLP, to send a model of >= 500 MB.

:class:`WideTabularTask` is :class:`~clients.tabular.task.TabularClsTask` (the synthetic
tabular hospitals, 26 inputs) whose two hidden layers are :attr:`WideTabularTask.width`
units wide: ``26 w + w^2 + 3 w + 1`` float32 parameters, so ``w = 11_500`` is 132.6 M
parameters, 530 MB. It is registered in :data:`clients.registry.TASKS` only by
:mod:`tests.integration.large_model_run`, in its own process.
"""

from __future__ import annotations

from torch import nn

from clients.tabular.heart_variables import HEART_FEATURES
from clients.tabular.scaling import input_names
from clients.tabular.task import TabularClsTask
from clients.training.site_task import TaskSettings
from models.tabular_mlp import make_tabular_mlp

__all__ = ["WideTabularTask", "parameter_count"]

#: Inputs of a row of the 13 standard columns (values and missing indicators).
INPUTS = len(input_names(HEART_FEATURES))


def parameter_count(width: int) -> int:
    """Float32 parameters of the MLP of ``width`` hidden units (26 inputs, one logit)."""
    return INPUTS * width + width + width * width + width + width + 1


class WideTabularTask(TabularClsTask):
    """tabular-cls with hidden layers of :attr:`width` units (set before the run)."""

    name = "wide-tabular"
    width: int = 32

    def build_model(self, private: bool = False) -> nn.Module:
        """The server's network: the synthetic hospitals have the standard columns."""
        return self.model_for_run(self.settings, private)

    @classmethod
    def model_for(cls, settings: TaskSettings) -> nn.Module:
        """The wide MLP of the standard columns; no dropout (a no-op for the message size)."""
        return make_tabular_mlp(INPUTS, settings.num_labels, width=cls.width, dropout=0.0)
