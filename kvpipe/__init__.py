"""kvpipe, the application: the command line, sweeps, capacity planning, studies, plots, benchmarks and the HTML report.

It sits on top of the floors below it (``backends`` < ``sim`` < ``validate`` < ``kvpipe``) and is the only package that
turns flags into configurations and results into files for people.
"""
