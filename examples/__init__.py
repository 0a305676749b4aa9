"""Runnable examples of bandgate; each is imported by a test."""
