"""TDM end to end on a planted affinity (``tdm_world``): a tree built by init_tree over 64
items of 8 categories, users who click items of one category (their history too),
trained through train_eval on tdm_sampler's (user, tree node) rows; the evaluation's rows
are told apart (AUC far above chance) only by relating the node to the user's history."""

from __future__ import annotations

from tdm_world import write_world

from hashrec.config import load_pipeline_config, validate_pipeline_config
from hashrec.train import train_and_evaluate


def test_tdm_learns_which_tree_nodes_lead_to_the_users_items(tmp_path):
    config = load_pipeline_config(write_world(tmp_path))
    validate_pipeline_config(config)
    result = train_and_evaluate(config)
    # 256 rows, each with 5 ancestors and 1 + 1 + 2 + 2 + 3 + 4 negatives
    assert result["num_examples"] == 256 * (1 + 5 + 13), result
    # a category's 8 leaves fill one subtree of level 3: below it every positive shares
    # the history's category and no negative does; above it the node ids must be learned
    assert result["auc"] > 0.9, result
