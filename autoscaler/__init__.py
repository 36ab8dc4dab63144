"""The scheduler, cost guard and Ray NodeProvider plugin (see DESIGN.md).

Arrows run one way: ``autoscaler`` -> ``hypermedia`` core -> ``pipelines``. Not
built yet: the scheduler issue fills this package.
"""
