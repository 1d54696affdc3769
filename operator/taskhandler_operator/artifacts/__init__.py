"""Artifact readers (Go, Java, TypeScript), bundle listing and the fast-path planner."""
