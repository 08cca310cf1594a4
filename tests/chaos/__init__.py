"""The chaos suite: failures under a write load, checked by chaos.checker."""
