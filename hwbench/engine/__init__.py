"""Training engines: how a model, an optimizer and the parallel layout are put together."""
