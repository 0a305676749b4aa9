"""The bandgate topology model: priorities, bands, names, declaration and export."""
