"""Every error the product defines hangs off strategies.wire.errors.FedMedError by one branch."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import pickle

import pytest

from strategies.wire import errors

BRANCHES = (errors.ConfigError, errors.SiteError, errors.ItemError, errors.ReplyError,
            errors.FederationError)


def _product_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package_name in ("strategies", "clients", "app", "models"):
        package = importlib.import_module(package_name)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            module = importlib.import_module(info.name)
            for _, obj in inspect.getmembers(module, inspect.isclass):
                if issubclass(obj, BaseException) and obj.__module__ == info.name:
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[name] for name in sorted(found)]


PRODUCT_EXCEPTIONS = _product_exceptions()


def test_the_scan_finds_the_known_errors() -> None:
    names = {cls.__name__ for cls in PRODUCT_EXCEPTIONS}
    assert {"RunConfigError", "ManifestError", "StudyError", "InvalidReplyError",
            "NoValidRepliesError", "PluginError", "NonFiniteLossError"} <= names


@pytest.mark.parametrize("cls", PRODUCT_EXCEPTIONS, ids=lambda c: c.__qualname__)
def test_each_error_has_one_branch_of_the_root(cls: type[BaseException]) -> None:
    if cls in BRANCHES or cls is errors.FedMedError:
        return
    branches = [b for b in BRANCHES if issubclass(cls, b)]
    assert len(branches) == 1, f"{cls.__module__}.{cls.__qualname__} is under {branches}"


def test_a_broken_manifest_means_the_site_not_one_item() -> None:
    from clients.errors import ManifestError, StudyError

    error = ManifestError("/site/manifest.csv", "line 3: bad split")
    assert isinstance(error, errors.SiteError)
    assert not isinstance(error, (StudyError, errors.ItemError))
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.path, copy.reason) == (error.path, error.reason)
