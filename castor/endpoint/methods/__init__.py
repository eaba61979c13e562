"""Endpoint method groups: each module registers its methods on a Dispatcher."""
