"""Proof of numerics: every rule checked on instances drawn from its verification domain."""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxfuse.support.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from onnxfuse.proof.check import Failure, RuleReport, check_rule
    from onnxfuse.proof.domain import Domain, VerifyError, parse_domain

# Imported on first use: every command line run imports this package (for the `check`
# subcommand's arguments) and should not load the proof machinery then.
_EXPORTS = {
    "Failure": "check",
    "RuleReport": "check",
    "check_rule": "check",
    "Domain": "domain",
    "VerifyError": "domain",
    "parse_domain": "domain",
}
__all__ = [
    "Domain",
    "Failure",
    "RuleReport",
    "VerifyError",
    "check_rule",
    "parse_domain",
]


__getattr__ = lazy_getattr(__name__, _EXPORTS)
