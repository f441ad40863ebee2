"""``python -m slotkit demo``: watch slotkit throttle five very different sites.

Pieces, each usable on its own:

* :mod:`slotkit.demo.sites` - the local server (127.0.0.1 only) and the name
  resolver that sends the demo host names to it;
* :mod:`slotkit.demo.spider` - the spider that walks every site;
* :mod:`slotkit.demo.monitor` - samples the live scopes and the crawl's signals;
* :mod:`slotkit.demo.table` - the live per-scope table and the final summary;
* :mod:`slotkit.demo.chart` - the SVG timeline, written without any plotting library;
* :mod:`slotkit.demo.run` - ties them together on one reactor.
"""
