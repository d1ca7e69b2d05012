"""Diff → pillars → findings: the config model, tree-sitter facts, declarative rules, the new-vs-old split."""
