"""The bandgate consumer library."""
