"""The bandgate HTTP gateway and publishing core."""
