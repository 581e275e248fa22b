"""Training-side algorithms: grouping, advantages, balancing, bin-packing, losses, trainer."""
