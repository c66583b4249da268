"""Our own strategies (not Pulsar's): one load measure shared by shedding and placement.

* ``usage_projection``: turns a bundle's rates into a usage change on a given broker, with the
  cycle's moves in flight projected in.
* ``projected_usage_shedder.ProjectedUsageShedder``: the shedder of our default pair; it moves
  only above the balance band, each move chosen by ``move_search`` over the bundles
  ``shed_candidates`` ranks, under placement policies through ``policy_moves``.
* ``least_projected_usage.LeastProjectedUsage``: the placement strategy of our default pair.
"""
