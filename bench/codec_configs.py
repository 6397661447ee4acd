"""The codec settings the compression benchmarks compare, as the product's run-config keys.

A config is written ``"<uplink spec>[+ef] [down=<downlink spec>] [warmup=<rounds>]"``
(``"topk:0.01+ef down=topk:0.01 warmup=4"``); :meth:`CodecConfig.overrides`
turns it into ``strategy.codec``, ``strategy.error-feedback``,
``strategy.downlink-codec`` and ``strategy.codec-warmup-rounds``, which the
product validates (:func:`app.engine.full_run_config`) before a run starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.compression import parse_spec

__all__ = ["CodecConfig", "CONFIGS", "parse_config"]


@dataclass(frozen=True)
class CodecConfig:
    """One codec setting: the uplink spec, error feedback, the downlink spec, warm-up rounds."""

    spec: str
    error_feedback: bool
    downlink: str = "none"
    warmup_rounds: int = 0

    @property
    def _options(self) -> str:
        down = f" down={self.downlink}" if parse_spec(self.downlink).name != "none" else ""
        return down + (f" warmup={self.warmup_rounds}" if self.warmup_rounds else "")

    @property
    def name(self) -> str:
        if parse_spec(self.spec).name == "none":
            return "none" + self._options
        return f"{self.spec}{'+ef' if self.error_feedback else ''}" + self._options

    @property
    def label(self) -> str:
        if parse_spec(self.spec).name == "none":
            return "dense fp32 (none)" + self._options
        return f"{self.spec} {'+EF' if self.error_feedback else 'no EF'}" + self._options

    def overrides(self) -> dict[str, str | bool | int]:
        """The run-config keys of this setting."""
        return {"strategy.codec": self.spec, "strategy.error-feedback": self.error_feedback,
                "strategy.downlink-codec": self.downlink,
                "strategy.codec-warmup-rounds": self.warmup_rounds}


#: The error-feedback study of ``bench/compression_fedavg.py``.
CONFIGS: tuple[CodecConfig, ...] = (
    CodecConfig("none", False),
    CodecConfig("topk:0.1", True),
    CodecConfig("topk:0.1", False),
    CodecConfig("topk:0.01", True),
    CodecConfig("topk:0.01", False),
    CodecConfig("topk:0.001", True),
    CodecConfig("topk:0.001", False),
    CodecConfig("qsgd:16", True),
    CodecConfig("sign", True),
)


def parse_config(text: str) -> CodecConfig:
    """``"topk:0.01+ef"`` -> ``CodecConfig("topk:0.01", True)``; ``"none"`` -> dense.

    Options follow, separated by spaces (as :attr:`CodecConfig.name` writes
    them): ``down=<downlink spec>`` and ``warmup=<rounds>``.

    Raises
    ------
    ValueError
        For an unknown option or a warm-up that is not an integer (a
        ``CodecError``, a ``ValueError`` too, for a spec that does not parse).
    """
    first, *options = text.split()
    ef = first.lower().endswith("+ef")
    spec = first[:-3] if ef else first
    parse_spec(spec)  # validates
    settings: dict = {}
    for option in options:
        key, _, value = option.partition("=")
        if key == "down":
            parse_spec(value)  # validates
            settings["downlink"] = value
        elif key == "warmup" and value.isdigit():
            settings["warmup_rounds"] = int(value)
        else:
            raise ValueError(f"config {text!r}: option {option!r} is not 'down=<spec>' or "
                             "'warmup=<rounds>'")
    return CodecConfig(spec, ef and parse_spec(spec).name != "none", **settings)
