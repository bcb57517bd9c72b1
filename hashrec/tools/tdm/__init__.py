"""TDM (tree-based deep model) tools: ``init_tree`` builds the initial tree."""
