"""great-expectations page views whose templates in the project's plugins/custom_data_docs/views/ come before the
package's own (great-expectations puts a project's views after its own, so they can add templates but not replace
one). The project's site config names these classes (`view:` of its section and index builders,
data_contracts/project.py), and its views are the package's templates with every CDN asset loaded from the
site's static/ folder: pages that render without internet. Imported by great-expectations when it builds the
site, never with the contracts (it imports great-expectations)."""

from __future__ import annotations

from pathlib import Path

from great_expectations.render.view import DefaultJinjaIndexPageView, DefaultJinjaPageView
from jinja2 import ChoiceLoader, FileSystemBytecodeCache, FileSystemLoader


def _views_first(view) -> None:
    """The project's views first, and the templates' compiled code kept beside them: every site build makes new
    views, which parsed and compiled every template again (most of a build's second)."""
    if view.custom_views_directory:
        view.env.loader = ChoiceLoader([FileSystemLoader(view.custom_views_directory), view.env.loader])
        # <gx_folder>/<dataset>/gx/plugins/custom_data_docs/views: one cache for every dataset's project (the key
        # is the template's name and source: the projects' templates are the same)
        cache = Path(view.custom_views_directory).parents[4] / ".jinja-cache"
        cache.mkdir(exist_ok=True)
        view.env.bytecode_cache = FileSystemBytecodeCache(str(cache))


class OfflinePageView(DefaultJinjaPageView):
    def __init__(self, custom_styles_directory=None, custom_views_directory=None) -> None:
        super().__init__(custom_styles_directory, custom_views_directory)
        _views_first(self)


class OfflineIndexPageView(DefaultJinjaIndexPageView):
    def __init__(self, custom_styles_directory=None, custom_views_directory=None) -> None:
        super().__init__(custom_styles_directory, custom_views_directory)
        _views_first(self)
