"""TorchEasyRec's configurable backbone: lambdas by allow-list, block modules, the block DAG."""
