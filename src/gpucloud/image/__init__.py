"""The GPU image recipe: the pinned version matrix, its compatibility rules, and the Image Builder
component documents rendered from it."""
