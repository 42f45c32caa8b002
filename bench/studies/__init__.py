"""Questions about the recipe and the system, answered by runs."""
