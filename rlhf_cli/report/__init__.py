"""Reading a run's logged metrics and drawing its training curves."""
