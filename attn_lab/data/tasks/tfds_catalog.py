"""Any TFDS catalog dataset as a task: the family of names ``tfds:<name>[/<config>][:<version>]``.

One declaration serves every catalog name; :mod:`attn_lab.data.catalog` prepares and reads the datasets. The kind
is an option here (``task.kind``), and an option set to None means its default.
"""

from __future__ import annotations

import functools
from typing import Any

from attn_lab.data import catalog
from attn_lab.data.tasks import Task, TaskSpec, register_family


def catalog_task(name: str) -> TaskSpec:
    """The declaration of the catalog dataset ``name`` ('tfds:...')."""
    return TaskSpec(name, None, catalog.DEFAULTS, functools.partial(_load, name),
                    check=functools.partial(catalog.check, name),
                    read_options=lambda cfg, defaults: catalog.options(cfg),
                    is_prepared=lambda opts, data_dir: catalog.builder_for(name, data_dir).is_prepared())


def _load(name: str, opts: dict[str, Any], data_dir: str) -> Task:
    return Task(**catalog.load(name, opts, data_dir))


register_family(catalog.PREFIX, catalog_task)
