"""CEL for Fleet: compile once, evaluate bounded (engine.py), with the Kubernetes
extension libraries (library.py).  Used by admission (ValidatingAdmissionPolicy,
webhook matchConditions) and meant for CRD `x-kubernetes-validations` too."""

from fleet.cel.engine import (
    COST_EXCEEDED,
    STEP_LIMIT,
    TIME_LIMIT,
    CompileError,
    EvalError,
    LazyMap,
    Program,
    compile,
    compile_error,
    evaluate,
    evaluate_json,
    field_references,
    to_activation,
    undefined_field_error,
)
from fleet.cel.library import to_cel, to_json

__all__ = ["COST_EXCEEDED", "STEP_LIMIT", "TIME_LIMIT", "CompileError", "EvalError", "LazyMap", "Program",
           "compile", "compile_error", "evaluate", "evaluate_json", "field_references", "to_activation", "to_cel", "to_json", "undefined_field_error"]
