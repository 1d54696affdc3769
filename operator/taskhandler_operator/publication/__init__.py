"""Publication under control (pure): what a pass would change in the published bindings, and
whether the bundle's publish policy lets it through (docs/operator.md, "Publication")."""
