"""The rule language: rule files, patterns and guard expressions."""
