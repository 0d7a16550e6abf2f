"""The calculator demo behind ``lightrail demo``: a plain OpenAI-client agent with one tool (`agent`), generated
arithmetic word problems (`data`), an imperfect scripted teacher for the warm start (`teacher`), the agent wrapped
for lightrail (`train`) and the whole run (`demo`). ``examples/calculator/`` shows the same pieces as an example.

Submodules are imported explicitly (``from lightrail.demos.calculator.data import make_splits``): importing this
package loads nothing else.
"""
