"""The morning report: ``build`` gathers the window's fires and cycles, ``render_html`` draws one page."""

from evolve.report.data import ReportData, build
from evolve.report.render import render_html

__all__ = ["ReportData", "build", "render_html"]
