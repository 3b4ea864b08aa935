"""Evaluation of dpfed against the comparison methods (method.md sections 5 and 7)."""
