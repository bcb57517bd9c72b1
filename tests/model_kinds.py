"""Pipeline configs of every ranking model kind on generated Taobao-like columns."""

from __future__ import annotations

FEATURES = """
train_config {
  sparse_optimizer { adagrad_optimizer { lr: 0.05 } constant_learning_rate {} }
  dense_optimizer { adam_optimizer { lr: 0.003 } constant_learning_rate {} }
  num_epochs: 1
}
data_config {
  batch_size: 128
  dataset_type: ParquetDataset
  label_fields: "clk"
  num_workers: 0
}
feature_configs { id_feature { feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 8
  dynamicemb { max_capacity: 4096 init_capacity_per_rank: 1024
               initializer_args { mode: "NORMAL" std_dev: 0.05 } } } }
feature_configs { id_feature { feature_name: "adgroup_id" expression: "item:adgroup_id"
  embedding_dim: 8
  dynamicemb { max_capacity: 4096 init_capacity_per_rank: 1024
               initializer_args { mode: "NORMAL" std_dev: 0.05 } } } }
feature_configs { id_feature { feature_name: "cate_id" expression: "item:cate_id"
  hash_bucket_size: 500 embedding_dim: 8 } }
feature_configs { id_feature { feature_name: "cms_segid" expression: "user:cms_segid"
  num_buckets: 98 embedding_dim: 8 } }
feature_configs { id_feature { feature_name: "pid" expression: "context:pid"
  hash_bucket_size: 20 embedding_dim: 8 } }
feature_configs { raw_feature { feature_name: "price" expression: "item:price" } }
"""
# The click sequence over the candidate's tables (its sub-features share them).
CLICK_SEQUENCE = """
feature_configs { sequence_feature { sequence_name: "click_50_seq" sequence_length: 10
  sequence_delim: "|"
  features { id_feature { feature_name: "adgroup_id" expression: "item:adgroup_id"
    embedding_dim: 8 } }
  features { id_feature { feature_name: "cate_id" expression: "item:cate_id"
    embedding_dim: 8 } } } }
"""
FEATURES += CLICK_SEQUENCE

MODELS = {
    "multi_tower": """
  feature_groups { group_name: "user" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid"] }
  feature_groups { group_name: "item" group_type: DEEP
    feature_names: ["adgroup_id", "cate_id", "price"] }
  multi_tower {
    towers { input: "user" mlp { hidden_units: [16, 8] } }
    towers { input: "item" mlp { hidden_units: [8] } }
    final { hidden_units: [8] }
  }""",
    # the click sequence (sharing the candidate's tables) through three of TorchEasyRec's
    # sequence encoders, whose outputs (8, 8 x 3 and 8 wide) follow the group's features
    "multi_tower_seq_encoders": """
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid", "adgroup_id", "cate_id", "price"]
    sequence_groups { feature_names: ["adgroup_id", "cate_id", "click_50_seq__adgroup_id",
                                      "click_50_seq__cate_id"] }
    sequence_encoders { din_encoder { attn_mlp { hidden_units: [8] } } }
    sequence_encoders { multi_window_din_encoder { attn_mlp { hidden_units: [8] }
                                                   windows_len: [2, 8] } }
    sequence_encoders { pooling_encoder { pooling_type: "mean" } } }
  multi_tower { towers { input: "all" mlp { hidden_units: [16, 8] } } }""",
    # the click sequence through TorchEasyRec's hstu_encoder (two HSTU blocks; it reads no
    # query): its last valid position, 16 wide, follows the group's features. No dropout:
    # a graphed step draws other random numbers than an eager one.
    "multi_tower_hstu": """
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid", "adgroup_id", "cate_id", "price"]
    sequence_groups { feature_names: ["click_50_seq__adgroup_id", "click_50_seq__cate_id"] }
    sequence_encoders { hstu_encoder { sequence_dim: 16 attn_dim: 8 linear_dim: 8
      max_seq_length: 10 num_heads: 2 num_blocks: 2 pos_dropout_rate: 0
      linear_dropout_rate: 0 } } }
  multi_tower { towers { input: "all" mlp { hidden_units: [16, 8] } } }""",
    # user_id and adgroup_id (dynamic) and cate_id have a wide table besides their own;
    # pid is only in the WIDE group: it has its wide table alone.
    "wide_and_deep": """
  feature_groups { group_name: "wide" group_type: WIDE
    feature_names: ["user_id", "adgroup_id", "cate_id", "pid"] }
  feature_groups { group_name: "deep" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "price"] }
  wide_and_deep {
    deep { hidden_units: [16, 8] }
    final { hidden_units: [4] }
    wide_embedding_dim: 2
  }""",
    # the FM pairs the 8-wide embeddings of the DEEP group "fm"; price feeds the deep MLP
    "deepfm": """
  feature_groups { group_name: "wide" group_type: WIDE
    feature_names: ["user_id", "cate_id", "pid"] }
  feature_groups { group_name: "deep" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "price"] }
  feature_groups { group_name: "fm" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid"] }
  deepfm {
    deep { hidden_units: [16, 8] }
    final { hidden_units: [4] }
  }""",
    # the dense MLP's output (8 wide) interacts with the five 8-wide embeddings
    "dlrm": """
  feature_groups { group_name: "sparse" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid"] }
  feature_groups { group_name: "dense" group_type: DEEP feature_names: ["price"] }
  dlrm {
    dense_mlp { hidden_units: [16, 8] }
    final { hidden_units: [16, 8] }
  }""",
    # the cross network reads the 41-wide concatenation (five embeddings and price)
    "dcn_v1": """
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  dcn_v1 {
    cross_tower { cross_num: 2 }
    deep_tower { hidden_units: [16, 8] }
    final_dnn { hidden_units: [8] }
  }""",
    # the backbone narrows the input to 16 columns before the rank-4 cross network
    "dcn_v2": """
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  dcn_v2 {
    backbone { hidden_units: [16] }
    cross { cross_num: 2 low_rank: 4 }
    deep { hidden_units: [16, 8] }
    final { hidden_units: [8] }
  }""",
    # serial blocks, with batch norm in the top MLP (its statistics are exported too)
    "mask_net": """
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  mask_net {
    mask_net_module {
      n_mask_blocks: 2
      mask_block { reduction_ratio: 0.5 hidden_dim: 16 }
      top_mlp { hidden_units: [8] use_bn: true }
      use_parallel: false
    }
  }""",
    # the dense MLP's 8-wide output and the five embeddings: 6 rows -> 5 (residual
    # projected) -> 5 (residual the identity), then the final MLP over 5 x 8
    "wukong": """
  feature_groups { group_name: "sparse" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid"] }
  feature_groups { group_name: "dense" group_type: DEEP feature_names: ["price"] }
  wukong {
    dense_mlp { hidden_units: [16, 8] }
    wukong_layers { lcb_feature_num: 2 fmb_feature_num: 3 compressed_feature_num: 4
                    feature_num_mlp { hidden_units: [16] } }
    wukong_layers { lcb_feature_num: 3 fmb_feature_num: 2 compressed_feature_num: 4
                    feature_num_mlp { hidden_units: [16] } }
    final { hidden_units: [8] }
  }""",
    # the CIN crosses the four wide embeddings (2 columns each; pid has its wide table alone)
    "xdeepfm": """
  feature_groups { group_name: "wide" group_type: WIDE
    feature_names: ["user_id", "adgroup_id", "cate_id", "pid"] }
  feature_groups { group_name: "deep" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "price"] }
  xdeepfm {
    cin { cin_layer_size: [8, 4] }
    deep { hidden_units: [16, 8] }
    final { hidden_units: [8] }
    wide_embedding_dim: 2
  }""",
    # a backbone: the cross network (two recurrent steps over [x_0, x_l]) beside an MLP
    # of the user group, their outputs concatenated into the final MLP; the cross
    # network's group ends in its click sequence's mean (a sequence encoder)
    "rank_backbone": """
  feature_groups { group_name: "user" group_type: DEEP
    feature_names: ["user_id", "cms_segid", "pid"] }
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"]
    sequence_groups { feature_names: ["click_50_seq__adgroup_id", "click_50_seq__cate_id"] }
    sequence_encoders { pooling_encoder { pooling_type: "mean" } } }
  rank_backbone { backbone {
    blocks { name: "cross" inputs { feature_group_name: "all" input_fn: "lambda x: [x, x]" }
             recurrent { num_steps: 2 fixed_input_index: 0
                         module { class_name: "Cross" cross { cross_num: 1 } } } }
    blocks { name: "user" inputs { feature_group_name: "user" }
             module { class_name: "MLP" mlp { hidden_units: [8] } } }
    blocks { name: "final" inputs { block_name: "cross" } inputs { block_name: "user" }
             module { class_name: "MLP" mlp { hidden_units: [8] } } }
    concat_blocks: "final"
  } }""",
    # the light network pairs its 8-wide layer with the booster's second (cosine hint)
    "rocket_launching": """
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  rocket_launching {
    share_mlp { hidden_units: [32] }
    booster_mlp { hidden_units: [16, 8, 8] }
    light_mlp { hidden_units: [8] }
    feature_based_distillation: true
  }""",
}
# The suffix of the models' outputs and metrics (probs_light, auc_light) where they have one.
SUFFIX = {"rocket_launching": "_light"}

# PEPNet's groups (the multi-task tests' models): EPNet gated by the context (pid), a
# PPNet per task gated by the user and the item.
PEPNET_GROUPS = """
  feature_groups { group_name: "all" group_type: DEEP
    feature_names: ["user_id", "adgroup_id", "cate_id", "cms_segid", "pid", "price"] }
  feature_groups { group_name: "domain" group_type: DEEP feature_names: ["pid"] }
  feature_groups { group_name: "uia" group_type: DEEP feature_names: ["user_id", "adgroup_id"] }
"""


def pipeline_text(model: str, data_dir, model_dir, body: str | None = None) -> str:
    """The pipeline config of model kind ``model`` (a key of ``MODELS``), or of the model
    config text ``body`` (groups and model) over the same features."""
    body = MODELS[model] if body is None else body
    return (f'train_input_path: "{data_dir}/train"\neval_input_path: "{data_dir}/eval"\n'
            f'model_dir: "{model_dir}"\n{FEATURES}\nmodel_config {{{body}\n'
            f'  metrics {{ auc {{}} }}\n  losses {{ binary_cross_entropy {{}} }}\n}}\n')
