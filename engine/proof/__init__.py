"""Proof of numerics: every rule checked on instances drawn from its verification domain."""

from onnxfuse.proof.check import Failure, RuleReport, check_rule
from onnxfuse.proof.domain import Domain, VerifyError, parse_domain

__all__ = ["Domain", "Failure", "RuleReport", "VerifyError", "check_rule", "parse_domain"]
