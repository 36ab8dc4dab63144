"""The scheduler, cost guard and Ray NodeProvider plugin (see DESIGN.md).

Arrows run one way: ``autoscaler`` -> ``hypermedia`` core -> ``pipelines``.
``config`` is the seed's ``scheduler.json``; the policy, cost guard, loop, simulator
and the Ray/cloud side are still to come (issues 5 and 6).
"""
