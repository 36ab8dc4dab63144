"""The scheduler, cost guard and Ray node provider (see DESIGN.md).

Arrows run one way: ``autoscaler`` -> ``hypermedia`` core -> ``pipelines``.
``config`` is the seed's ``scheduler.json``; ``policy``, ``cost`` and ``admission`` (the
launch rule the policy and the provider share) are pure;
``scheduler`` is the loop; ``simulate`` replays traces (through ``sim_world``, beside
``sim_baselines``, reported by ``sim_report``); ``provider`` is the Ray node
provider, ``drivers`` the clouds, ``rayfleet`` the loop's hands on a Ray cluster and
``head`` the services a ``ray up`` head runs.
"""
