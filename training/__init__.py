"""Training code for the shipped shapes text-to-image model and the shapes classifier."""
