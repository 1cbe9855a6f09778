"""Course furniture: what the notebooks use to teach, none of which the inference code needs.

    notebook.py            the first cell of every notebook (seeds, print options, plot style, device)
    plotting.py            one figure style; figures saved as deterministic PNGs and shown from the file
    widgets.py             the sampling panel of chapter 09 (sliders over the real model)
    diagrams.py            concept diagrams: the cache growing (05), one speculative round (12)
    layer_map.py           a drawn map of one transformer block with every tensor's shape (01)
    attention_maps.py      attention weights recomputed from a layer's own weights (03, 08)
    paged_kv_simulator.py  chapter 05's contiguous vs paged allocation: slots counted, steps priced in seconds
    exercises/             the exercise checks, one module per chapter

Nothing here is imported by the library below it (model, caches, decoding, serving); it imports from them.
"""
