"""Operations, grouped by family; each module says per op its output shape, its
splittable dims, flops, gradient and lowering."""
