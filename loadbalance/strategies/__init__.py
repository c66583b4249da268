"""Our own strategies (not Pulsar's): one load measure shared by shedding and placement.

* ``usage_projection``: turns a bundle's rates into a usage change on a given broker.
* ``projected_usage_shedder.ProjectedUsageShedder``: the shedder of our default pair.
* ``least_projected_usage.LeastProjectedUsage``: the placement strategy of our default pair.
"""
