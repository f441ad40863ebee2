"""Benchmarks comparing slotkit's downloader with Scrapy's stock downloader.

Run ``python -m benchmarks --help`` from the repository root. Every crawl
runs in its own child process (a Twisted reactor starts only once per
process) through the real Scrapy engine, with
:class:`slotkit.testing.InMemoryDownloadHandler` standing in for HTTP, so
the figures measure the engine and downloader rather than the network.
"""
